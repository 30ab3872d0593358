MIGRATIONS = [
    """
    CREATE TABLE jobs (
        job_id     text PRIMARY KEY,
        tenant_id  text NOT NULL,
        spec       jsonb NOT NULL
    );
    CREATE TABLE final_checkpoints (
        job_id     text PRIMARY KEY,
        uri        text NOT NULL,
        manifest_sha256 text NOT NULL,
        step       int NOT NULL
    );
    CREATE TABLE evals (
        job_id     text PRIMARY KEY,
        verdict    text NOT NULL,
        event      jsonb NOT NULL
    );
    CREATE TABLE models (
        model_id   text PRIMARY KEY,
        job_id     text NOT NULL UNIQUE,
        tenant_id  text NOT NULL,
        name       text NOT NULL,
        stage      text NOT NULL,
        artifact_uri text NOT NULL,
        artifact_sha256 text NOT NULL,
        lineage    jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE stage_history (
        id         bigserial PRIMARY KEY,
        model_id   text NOT NULL,
        from_stage text,
        to_stage   text NOT NULL,
        reason     text NOT NULL,
        at         timestamptz NOT NULL DEFAULT now()
    );
    """,
]
