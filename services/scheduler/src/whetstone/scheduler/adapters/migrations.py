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
    """
    -- API keys (issue 15): stored only as a hash of the secret; revoked keys stay for the audit trail
    CREATE TABLE api_keys (
        key_id           text PRIMARY KEY,
        tenant_id        text NOT NULL,
        name             text NOT NULL DEFAULT '',
        scopes           text[] NOT NULL,
        secret_hash      text NOT NULL,
        rate_limit_per_s double precision,
        created_at       timestamptz NOT NULL,
        last_used_at     timestamptz,
        revoked_at       timestamptz
    );
    CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);
    """,
    """
    -- issue 15: OpenAI-shaped jobs: the registered model's name, event types, checkpoints with metrics
    ALTER TABLE jobs ADD COLUMN fine_tuned_model text;
    ALTER TABLE job_events ADD COLUMN type text NOT NULL DEFAULT 'message';
    CREATE TABLE job_checkpoints (
        job_id        text NOT NULL,
        checkpoint_id text NOT NULL,
        step          int  NOT NULL,
        kind          text NOT NULL,
        uri           text NOT NULL,
        created_at    timestamptz NOT NULL,
        metrics       jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (job_id, checkpoint_id)
    );
    CREATE INDEX job_checkpoints_step ON job_checkpoints (job_id, step DESC, checkpoint_id DESC);
    """,
    """
    -- issue 20: fencing (attempts up to fenced_attempt are refused), state timeouts, the data's schema
    ALTER TABLE jobs
        ADD COLUMN fenced_attempt int NOT NULL DEFAULT 0,
        ADD COLUMN last_activity_at timestamptz,
        ADD COLUMN timeouts int NOT NULL DEFAULT 0;
    ALTER TABLE datasets ADD COLUMN data_schema text;
    """,
]

# issue 15 item 7: job templates and tenant webhooks (appended: keep at the end)
MIGRATIONS.append(
    """
    -- job templates: immutable versions per tenant and name
    CREATE TABLE job_templates (
        tenant_id   text NOT NULL,
        name        text NOT NULL,
        version     int  NOT NULL,
        description text NOT NULL DEFAULT '',
        body        jsonb NOT NULL,
        created_at  timestamptz NOT NULL,
        PRIMARY KEY (tenant_id, name, version)
    );
    -- tenant webhooks and their deliveries (an outbox: written in the transaction of the change)
    CREATE TABLE webhooks (
        webhook_id  text PRIMARY KEY,
        tenant_id   text NOT NULL,
        url         text NOT NULL,
        events      text[] NOT NULL DEFAULT '{}',
        secret      text NOT NULL,
        description text NOT NULL DEFAULT '',
        created_at  timestamptz NOT NULL,
        deleted_at  timestamptz
    );
    CREATE INDEX webhooks_tenant ON webhooks (tenant_id) WHERE deleted_at IS NULL;
    CREATE TABLE webhook_deliveries (
        delivery_id      bigserial PRIMARY KEY,
        webhook_id       text NOT NULL REFERENCES webhooks (webhook_id),
        tenant_id        text NOT NULL,
        event_id         text NOT NULL,
        event_type       text NOT NULL,
        payload          jsonb NOT NULL,
        status           text NOT NULL DEFAULT 'pending',
        attempts         int  NOT NULL DEFAULT 0,
        next_attempt_at  timestamptz NOT NULL DEFAULT now(),
        last_status_code int,
        last_error       text,
        created_at       timestamptz NOT NULL DEFAULT now(),
        updated_at       timestamptz NOT NULL DEFAULT now(),
        UNIQUE (webhook_id, event_id)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
    CREATE INDEX webhook_deliveries_log ON webhook_deliveries (webhook_id, delivery_id DESC);
    -- a job reaching succeeded / failed / cancelled, by whatever path (handler, API, watcher), queues
    -- a delivery to each matching webhook of its tenant in the same transaction
    CREATE FUNCTION whetstone_job_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        kind text := 'job.' || NEW.status;
        ev   text := gen_random_uuid()::text;
    BEGIN
        INSERT INTO webhook_deliveries (webhook_id, tenant_id, event_id, event_type, payload)
        SELECT w.webhook_id, NEW.tenant_id, ev, kind,
               jsonb_build_object('id', NEW.job_id, 'object', 'fine_tuning.job', 'status', NEW.status,
                                  'fine_tuned_model', NEW.fine_tuned_model, 'error', NEW.error)
        FROM webhooks w
        WHERE w.tenant_id = NEW.tenant_id AND w.deleted_at IS NULL
          AND (cardinality(w.events) = 0 OR kind = ANY (w.events));
        RETURN NEW;
    END $$;
    CREATE TRIGGER jobs_webhooks_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled'))
        EXECUTE FUNCTION whetstone_job_webhooks();
    CREATE TRIGGER jobs_webhooks_update AFTER UPDATE OF status ON jobs FOR EACH ROW
        WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
        EXECUTE FUNCTION whetstone_job_webhooks();
    """
)

# the time a job entered its current state, for whetstone_job_state_age_seconds: updated_at moves with
# every progress report, so a job training for hours looked minutes old in its state
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN state_since timestamptz;
    UPDATE jobs SET state_since = updated_at;
    CREATE FUNCTION whetstone_job_state_since() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            NEW.state_since := NEW.updated_at;
        ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
            NEW.state_since := NEW.updated_at;
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER jobs_state_since BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW
        EXECUTE FUNCTION whetstone_job_state_since();
    """
)

# the overdue guard (issue 19) measures a job's queue wait over all its queue periods: the wait of the
# earlier ones, and when the current one began (a re-queued job keeps its original queued_at)
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN queued_since timestamptz, ADD COLUMN waited_s double precision NOT NULL DEFAULT 0;
    UPDATE jobs SET queued_since = queued_at WHERE status = 'queued';
    """
)

# how many rows of a dataset hold images (dataset.validated stats.rows_with_images): a job whose
# base model has no image processor is refused for such a file
MIGRATIONS.append(
    """
    ALTER TABLE datasets ADD COLUMN image_rows integer NOT NULL DEFAULT 0;
    """
)

# result_files: the job's results files, as ingest announced them (file.created)
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN result_files jsonb NOT NULL DEFAULT '[]'::jsonb;
    """
)

# files deleted through the Files API (dataset.deleted): no job is created or queued on them
MIGRATIONS.append(
    """
    CREATE TABLE dataset_deletions (
        tenant_id  text NOT NULL,
        dataset_id text NOT NULL,
        deleted_at timestamptz NOT NULL,
        PRIMARY KEY (tenant_id, dataset_id)
    );
    """
)

# the base model admission pinned gets its own columns (spec holds only the resolved TrainingSpec, once
# queued); a verdict that arrived before training completed is kept apart from the job's verdict; the
# request keeps the job id it was made for (it is the job.requested event)
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN base_model text, ADD COLUMN base_model_sha256 text, ADD COLUMN early_eval jsonb;
    UPDATE jobs SET base_model = spec->>'base_model', base_model_sha256 = spec->>'base_model_sha256';
    UPDATE jobs SET spec = NULL WHERE NOT spec ? 'dataset_id';
    UPDATE jobs SET early_eval = eval - 'early', eval = NULL WHERE eval ? 'early';
    UPDATE jobs SET request = request || jsonb_build_object('job_id', job_id) WHERE NOT request ? 'job_id';
    """
)

# what each node's newest heartbeat reports: the GPU ids it can take new work on (NULL: not
# reported, e.g. a node known only from the Kubernetes inventory) and whether it is draining
MIGRATIONS.append(
    """
    ALTER TABLE nodes ADD COLUMN free_gpu_ids integer[], ADD COLUMN draining boolean NOT NULL DEFAULT false;
    """
)

# attempts a job lost to a lost node, and the nodes they named: re-queues after node_lost are bounded
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN node_losses int NOT NULL DEFAULT 0, ADD COLUMN lost_nodes text[] NOT NULL DEFAULT '{}';
    """
)
