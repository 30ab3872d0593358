MIGRATIONS = [
    """
    CREATE TABLE dataset_versions (
        tenant_id   text NOT NULL,
        dataset_id  text NOT NULL,
        version     text NOT NULL,
        name        text NOT NULL,
        status      text NOT NULL,
        report_uri  text,
        validated   jsonb NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant_id, dataset_id)
    );
    """,
    """
    ALTER TABLE dataset_versions ADD COLUMN base_model text;
    """,
]
