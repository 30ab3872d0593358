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
    """
    -- Files API (issue 15): one row per tenant and file (the file id is the dataset id); which jobs use it
    CREATE TABLE files (
        tenant_id       text NOT NULL,
        file_id         text NOT NULL,
        filename        text NOT NULL,
        purpose         text NOT NULL,
        dataset_purpose text NOT NULL,
        bytes           bigint NOT NULL,
        sha256          text NOT NULL,
        source_uri      text NOT NULL,
        created_at      timestamptz NOT NULL,
        deleted_at      timestamptz,
        PRIMARY KEY (tenant_id, file_id)
    );
    CREATE INDEX files_listing ON files (tenant_id, created_at, file_id) WHERE deleted_at IS NULL;
    CREATE TABLE file_usage (
        tenant_id text NOT NULL,
        file_id   text NOT NULL,
        job_id    text NOT NULL,
        since     timestamptz NOT NULL,
        ended_at  timestamptz,
        PRIMARY KEY (tenant_id, file_id, job_id)
    );
    CREATE INDEX file_usage_job ON file_usage (tenant_id, job_id) WHERE ended_at IS NULL;
    """,
    """
    -- a dataset.submitted event only queues its validation here; a worker claims it under a lease and runs
    -- the gate with no transaction open and no partition held (a dead worker's claim is taken over)
    CREATE TABLE validations (
        submission_id text PRIMARY KEY,
        tenant_id     text NOT NULL,
        dataset_id    text NOT NULL,
        submitted     jsonb NOT NULL,
        trace_id      text NOT NULL,
        status        text NOT NULL DEFAULT 'pending',
        lease_owner   text,
        lease_until   timestamptz,
        attempts      int NOT NULL DEFAULT 0,
        retries       int NOT NULL DEFAULT 0,
        not_before    timestamptz,
        transient_since timestamptz,
        last_error    text,
        created_at    timestamptz NOT NULL DEFAULT now(),
        updated_at    timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX validations_open ON validations (created_at) WHERE status <> 'done';
    """,
    """
    -- results files: each job's step figures from job.progress / checkpoint.written, and
    -- the one results file made of them when training ends
    CREATE TABLE job_step_metrics (
        tenant_id text NOT NULL,
        job_id    text NOT NULL,
        step      int NOT NULL,
        attempt   int NOT NULL,
        metrics   jsonb NOT NULL,
        PRIMARY KEY (tenant_id, job_id, step)
    );
    CREATE TABLE job_result_files (         -- one row per job: its file, or NULL once the job was cancelled
        tenant_id  text NOT NULL,
        job_id     text NOT NULL,
        file_id    text,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant_id, job_id)
    );
    """,
    """
    -- every upload its own file id; an upload of bytes already accepted takes that verdict
    CREATE INDEX dataset_versions_content ON dataset_versions (tenant_id, version);
    """,
    """
    -- training ended before any step's figures were read (topics are not ordered with each other):
    -- the first figures read later make the results file
    CREATE TABLE job_training_ended (
        tenant_id text NOT NULL,
        job_id    text NOT NULL,
        PRIMARY KEY (tenant_id, job_id)
    );
    """,
    """
    -- W&B offline runs: a job whose job.queued asked for `wandb` (its plan: the block and the job's spec).
    -- 'waiting' until its results file is made; then 'pending' for a worker that writes the run under a lease
    -- with no transaction open, and records the result file once ('done'). A step read later bumps
    -- `revision`: the run is written again and the file rewritten in place.
    CREATE TABLE job_wandb_runs (
        run_key         text PRIMARY KEY,       -- tenant_id || '/' || job_id
        tenant_id       text NOT NULL,
        job_id          text NOT NULL,
        plan            jsonb NOT NULL,
        status          text NOT NULL DEFAULT 'waiting',
        revision        int NOT NULL DEFAULT 0,
        file_id         text,
        lease_owner     text,
        lease_until     timestamptz,
        attempts        int NOT NULL DEFAULT 0,
        not_before      timestamptz,
        last_error      text,
        created_at      timestamptz NOT NULL DEFAULT now(),
        updated_at      timestamptz NOT NULL DEFAULT now(),
        UNIQUE (tenant_id, job_id)
    );
    CREATE INDEX job_wandb_runs_open ON job_wandb_runs (created_at) WHERE status IN ('pending', 'running');
    """,
]
