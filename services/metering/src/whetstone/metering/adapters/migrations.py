MIGRATIONS = [
    """
    CREATE TABLE segments (
        segment_id   text PRIMARY KEY,
        job_id       text NOT NULL,
        tenant_id    text NOT NULL,
        gpu_type     text,
        gpu_count    int,
        spot         boolean,
        started_at   timestamptz,
        stopped_at   timestamptz,
        stop_kind    text,
        error_class  text,
        checkpointed_at timestamptz,
        terminal     boolean,
        events       text[] NOT NULL DEFAULT '{}'
    );
    CREATE INDEX segments_job ON segments (job_id);
    -- append-only ledger: corrections are new rows, never updates
    CREATE TABLE ledger (
        id           bigserial PRIMARY KEY,
        job_id       text NOT NULL,
        tenant_id    text NOT NULL,
        scope        text NOT NULL,            -- segment | job
        segment_id   text NOT NULL,            -- '' for the job total
        gpu_type     text,
        gpu_count    int NOT NULL DEFAULT 0,
        gpu_seconds  double precision NOT NULL,
        billable_gpu_seconds double precision NOT NULL,
        charge_class text NOT NULL,
        cost         numeric(14, 6) NOT NULL,
        price_version text NOT NULL,
        source_events text[] NOT NULL,
        created_at   timestamptz NOT NULL DEFAULT now(),
        UNIQUE (job_id, scope, segment_id)
    );
    CREATE INDEX ledger_tenant ON ledger (tenant_id, created_at);
    CREATE TABLE anomalies (
        id          bigserial PRIMARY KEY,
        job_id      text,
        segment_id  text,
        reason      text NOT NULL,
        event_id    text,
        created_at  timestamptz NOT NULL DEFAULT now()
    );
    """,
]
