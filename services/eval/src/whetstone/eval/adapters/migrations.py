MIGRATIONS = [
    """
    CREATE TABLE jobs (
        job_id     text PRIMARY KEY,
        tenant_id  text NOT NULL,
        spec       jsonb NOT NULL
    );
    CREATE TABLE final_checkpoints (
        job_id     text PRIMARY KEY,
        tenant_id  text NOT NULL,
        uri        text NOT NULL,
        manifest_sha256 text NOT NULL,
        trace_id   text NOT NULL
    );
    CREATE TABLE results (
        job_id     text PRIMARY KEY,
        tenant_id  text NOT NULL,
        lineage_key text NOT NULL,   -- tenant + base model + dataset: what "last accepted" compares with
        verdict    text NOT NULL,
        candidate_loss double precision NOT NULL,
        event      jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    """,
]
