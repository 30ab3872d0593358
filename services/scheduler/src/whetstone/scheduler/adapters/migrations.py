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
    """
    -- issue 6: gang placement, runtime estimates, preemption, quotas, node inventory
    ALTER TABLE jobs
        ADD COLUMN sort_key double precision,
        ADD COLUMN placement jsonb NOT NULL DEFAULT '[]',
        ADD COLUMN node_ids text[] NOT NULL DEFAULT '{}',
        ADD COLUMN estimated_runtime_s double precision,
        ADD COLUMN segment_started_at timestamptz,
        ADD COLUMN est_end_at timestamptz,
        ADD COLUMN last_checkpoint_at timestamptz,
        ADD COLUMN spot_preemptions int NOT NULL DEFAULT 0,
        ADD COLUMN priority_preemptions int NOT NULL DEFAULT 0,
        ADD COLUMN preempt_requested_at timestamptz,
        ADD COLUMN preempt_reason text,
        ADD COLUMN preempted_for text,
        ADD COLUMN quota jsonb;
    CREATE INDEX jobs_queue_order ON jobs (sort_key, job_id) WHERE status = 'queued';
    CREATE INDEX jobs_active ON jobs (status) WHERE status IN ('provisioning', 'running', 'checkpointing');
    CREATE INDEX jobs_in_flight ON jobs (tenant_id) WHERE status NOT IN ('succeeded', 'failed', 'cancelled');
    CREATE INDEX jobs_waiting_dataset ON jobs (created_at) WHERE status = 'validating_files';
    ALTER TABLE nodes
        ADD COLUMN gpu_memory_gb double precision NOT NULL DEFAULT 0,
        ADD COLUMN schedulable boolean NOT NULL DEFAULT true,
        ADD COLUMN unschedulable_reason text,
        ADD COLUMN source text NOT NULL DEFAULT 'heartbeat';
    CREATE TABLE dataset_submissions (
        tenant_id    text NOT NULL,
        dataset_id   text NOT NULL,
        submitted_at timestamptz NOT NULL,
        PRIMARY KEY (tenant_id, dataset_id)
    );
    """,
    """
    ALTER TABLE nodes ADD COLUMN address text;
    ALTER TABLE jobs ADD COLUMN trace_id text;
    """,
    """
    -- quota usage per job from usage.metered: segment events (with corrections) and the job total
    CREATE TABLE job_usage (
        job_id          text PRIMARY KEY,
        tenant_id       text NOT NULL,
        segments        int  NOT NULL DEFAULT 0,
        segment_seconds double precision NOT NULL DEFAULT 0,
        segment_cost    double precision NOT NULL DEFAULT 0,
        total_seconds   double precision,
        total_cost      double precision
    );
    -- one row per usage.metered key, so a re-sent event (new event_id, same job and segment key) counts once
    CREATE TABLE usage_seen (
        job_id text NOT NULL,
        key    text NOT NULL,
        PRIMARY KEY (job_id, key)
    );
    """,
]
