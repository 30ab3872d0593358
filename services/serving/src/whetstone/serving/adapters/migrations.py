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
    """
    -- OpenAI's model ids: a version's public id and job; the checkpoints of every job
    -- (checkpoint.written), served as `<fine_tuned_model>:ckpt-step-<N>` once the job's model is live
    ALTER TABLE model_versions ADD COLUMN fine_tuned_model text;
    ALTER TABLE model_versions ADD COLUMN job_id text;
    CREATE TABLE checkpoints (
        tenant_id       text NOT NULL,
        job_id          text NOT NULL,
        step            int NOT NULL,
        uri             text NOT NULL,
        manifest_sha256 text NOT NULL,
        attempt         int NOT NULL DEFAULT 1,
        PRIMARY KEY (tenant_id, job_id, step)
    );
    """,
]
