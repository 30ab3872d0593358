MIGRATIONS = [
    """
    CREATE SEQUENCE projection_changes;
    CREATE TABLE model_versions (
        model_id             text PRIMARY KEY,
        tenant_id            text NOT NULL,
        name                 text NOT NULL,
        stage                text NOT NULL,
        artifact_uri         text,
        artifact_sha256      text,
        files                jsonb NOT NULL DEFAULT '{}'::jsonb,
        base_model           text,
        base_model_sha256    text,
        chat_template_sha256 text,
        sequence             bigint NOT NULL DEFAULT 0,
        change_seq           bigint NOT NULL DEFAULT nextval('projection_changes'),
        updated_at           timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX model_versions_by_name ON model_versions (tenant_id, name);
    CREATE INDEX model_versions_by_change ON model_versions (change_seq);
    CREATE TABLE routes (
        tenant_id  text NOT NULL,
        name       text NOT NULL,
        variants   jsonb NOT NULL,              -- [] once deleted (a tombstone replicas follow)
        updated_by text NOT NULL,
        change_seq bigint NOT NULL DEFAULT nextval('projection_changes'),
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant_id, name)
    );
    """,
]
