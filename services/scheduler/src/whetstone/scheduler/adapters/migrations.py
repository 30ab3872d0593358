MIGRATIONS = [
    """
    CREATE TABLE datasets (
        tenant_id   text NOT NULL,
        dataset_id  text NOT NULL,
        version     text NOT NULL,
        status      text NOT NULL,
        purpose     text NOT NULL,
        train_uri   text,
        validation_uri text,
        rows_kept   int,
        tokens_total bigint,
        errors      jsonb NOT NULL DEFAULT '[]',
        cost_estimate jsonb,
        PRIMARY KEY (tenant_id, dataset_id)
    );
    CREATE TABLE jobs (
        job_id          text PRIMARY KEY,
        tenant_id       text NOT NULL,
        idempotency_key text NOT NULL,
        fingerprint     text NOT NULL,
        request         jsonb NOT NULL,
        status          text NOT NULL,
        tier            text NOT NULL,
        priority        int  NOT NULL DEFAULT 1,
        spec            jsonb,
        resources       jsonb,
        node_id         text,
        gpu_ids         int[] NOT NULL DEFAULT '{}',
        segment_id      text,
        attempt         int  NOT NULL DEFAULT 0,
        latest_checkpoint jsonb,
        progress        jsonb NOT NULL DEFAULT '{}',
        error           jsonb,
        eval            jsonb,
        trained_tokens  bigint,
        created_at      timestamptz NOT NULL,
        queued_at       timestamptz,
        started_at      timestamptz,
        finished_at     timestamptz,
        updated_at      timestamptz NOT NULL,
        UNIQUE (tenant_id, idempotency_key)
    );
    CREATE INDEX jobs_queue ON jobs (priority, queued_at) WHERE status = 'queued';
    CREATE INDEX jobs_tenant ON jobs (tenant_id, created_at DESC, job_id DESC);
    CREATE TABLE job_events (
        id         bigserial PRIMARY KEY,
        job_id     text NOT NULL,
        created_at timestamptz NOT NULL,
        level      text NOT NULL,
        message    text NOT NULL,
        data       jsonb NOT NULL DEFAULT '{}'
    );
    CREATE INDEX job_events_job ON job_events (job_id, id);
    CREATE TABLE nodes (
        node_id     text PRIMARY KEY,
        gpu_type    text NOT NULL,
        gpu_count   int  NOT NULL,
        spot        boolean NOT NULL,
        interconnect_group text NOT NULL,
        last_seen   timestamptz NOT NULL,
        lost        boolean NOT NULL DEFAULT false
    );
    """,
    """
    CREATE TABLE tenant_usage (
        tenant_id   text NOT NULL,
        month       text NOT NULL,
        jobs        int  NOT NULL DEFAULT 0,
        gpu_seconds double precision NOT NULL DEFAULT 0,
        cost        numeric(14, 6) NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant_id, month)
    );
    """,
]
