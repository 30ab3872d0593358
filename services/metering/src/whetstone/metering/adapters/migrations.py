MIGRATIONS = [
    """
    -- Every lifecycle event metering used, as received: the audit trail behind each ledger line.
    CREATE TABLE events (
        event_id     text NOT NULL,                     -- unique: the inbox admits each event once
        event_type   text NOT NULL,
        job_id       text NOT NULL,
        segment_id   text,
        tenant_id    text NOT NULL,
        occurred_at  timestamptz NOT NULL,
        received_at  timestamptz NOT NULL,
        envelope     text NOT NULL                      -- the message as received (JSON)
    );
    CREATE INDEX events_job ON events (job_id);

    -- Working state (mutable): what is known of each job and segment, see domain/ledger.py.
    CREATE TABLE jobs (
        job_id           text PRIMARY KEY,
        tenant_id        text NOT NULL,
        first_seen_at    timestamptz NOT NULL,
        queued           jsonb,
        terminal         jsonb,
        terminal_at      timestamptz,                   -- when the outcome was emitted (event time)
        review_decision  text,
        closed_at        timestamptz,
        events           text[] NOT NULL DEFAULT '{}',
        version          bigint NOT NULL DEFAULT 0      -- a random token, new at every write (cache check)
    );
    CREATE INDEX jobs_to_close ON jobs (terminal_at) WHERE closed_at IS NULL AND terminal_at IS NOT NULL;
    CREATE TABLE segments (
        job_id        text NOT NULL,
        segment_id    text NOT NULL,
        tenant_id     text NOT NULL,
        first_seen_at timestamptz NOT NULL,
        start         jsonb,
        stop          jsonb,
        stop_at       timestamptz,                      -- when the stop was emitted (event time)
        billed        jsonb,
        revision      int NOT NULL DEFAULT -1,
        anomaly       jsonb,
        waiting       boolean NOT NULL DEFAULT true,   -- neither billed nor anomalous yet
        events        text[] NOT NULL DEFAULT '{}',
        PRIMARY KEY (job_id, segment_id)
    );
    CREATE INDEX segments_waiting ON segments (stop_at) WHERE waiting;

    -- The ledger. Append-only: a correction is a reversal plus a new charge, never an edit.
    CREATE TABLE ledger (
        id                   bigserial PRIMARY KEY,
        job_id               text NOT NULL,
        tenant_id            text NOT NULL,
        scope                text NOT NULL CHECK (scope IN ('segment', 'job')),
        segment_id           text NOT NULL,            -- '' for the job total
        entry                text NOT NULL CHECK (entry IN ('charge', 'reversal')),
        revision             int NOT NULL,
        gpu_type             text,
        gpu_count            int NOT NULL,
        spot                 boolean,
        tier                 text NOT NULL,
        gpu_seconds          numeric(20, 6) NOT NULL,
        billable_gpu_seconds numeric(20, 6) NOT NULL,
        rate                 numeric(12, 6) NOT NULL,  -- USD per GPU-hour (0 on job totals)
        cost                 numeric(18, 6) NOT NULL,  -- USD charged
        list_cost            numeric(18, 6) NOT NULL,  -- USD refunded or held when not charged
        charge_class         text NOT NULL CHECK (charge_class IN ('charged', 'refunded', 'review')),
        price_version        text NOT NULL,
        period               text NOT NULL,            -- YYYY-MM
        segments             int NOT NULL,
        outcome              text,                     -- job totals: succeeded | failed | cancelled
        basis                text NOT NULL,
        source_events        text[] NOT NULL,
        usage_event_id       text NOT NULL,            -- the usage.metered event that announced it
        created_at           timestamptz NOT NULL DEFAULT now(),
        UNIQUE (job_id, scope, segment_id, revision, entry)
    );
    CREATE INDEX ledger_tenant_period ON ledger (tenant_id, period);
    CREATE FUNCTION ledger_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the ledger is append-only: % is not allowed (write a correction instead)', TG_OP;
    END $$;
    CREATE TRIGGER ledger_no_update BEFORE UPDATE OR DELETE ON ledger
        FOR EACH ROW EXECUTE FUNCTION ledger_is_append_only();
    CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
        FOR EACH STATEMENT EXECUTE FUNCTION ledger_is_append_only();

    -- Input that was not billed, with the reason; resolved when later events explain it.
    CREATE TABLE anomalies (
        id          bigserial PRIMARY KEY,
        job_id      text NOT NULL,
        segment_id  text NOT NULL,
        tenant_id   text NOT NULL,
        code        text NOT NULL,
        reason      text NOT NULL,
        event_ids   text[] NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        resolved_at timestamptz,
        resolution  text
    );
    CREATE INDEX anomalies_job ON anomalies (job_id);
    CREATE INDEX anomalies_open ON anomalies (job_id, segment_id, code) WHERE resolved_at IS NULL;

    -- Roll-ups kept in the same transactions as the ledger rows they sum.
    CREATE TABLE usage_monthly (
        tenant_id            text NOT NULL,
        period               text NOT NULL,
        gpu_type             text NOT NULL,
        charge_class         text NOT NULL,
        segments             bigint NOT NULL,
        gpu_seconds          numeric(24, 6) NOT NULL,
        billable_gpu_seconds numeric(24, 6) NOT NULL,
        cost                 numeric(20, 6) NOT NULL,
        list_cost            numeric(20, 6) NOT NULL,
        PRIMARY KEY (tenant_id, period, gpu_type, charge_class)
    );
    CREATE TABLE jobs_monthly (
        tenant_id text NOT NULL,
        period    text NOT NULL,
        outcome   text NOT NULL,
        jobs      bigint NOT NULL,
        PRIMARY KEY (tenant_id, period, outcome)
    );
    """,
    """
    -- The hash of the job id that Kafka's partitioner maps to a partition (adapters/partitions.py): a
    -- replica sweeps only the jobs whose partitions it holds. Rows from before it have none: the
    -- replica holding partition 0 sweeps those.
    ALTER TABLE jobs ADD COLUMN key_hash int;
    """,
]
