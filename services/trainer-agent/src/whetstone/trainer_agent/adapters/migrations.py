MIGRATIONS = [
    """
    CREATE TABLE runs (
        segment_id   text PRIMARY KEY,
        job_id       text NOT NULL,
        node_id      text NOT NULL,
        tenant_id    text NOT NULL,
        trace_id     text NOT NULL,
        attempt      int  NOT NULL,
        gpu_ids      int[] NOT NULL,
        spec         jsonb NOT NULL,
        resume_from  jsonb,
        status       text NOT NULL,  -- assigned | running | finished | cancelled | interrupted
        outcome      text,
        latest_checkpoint jsonb,
        started_at   timestamptz,
        finished_at  timestamptz,
        created_at   timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX runs_status ON runs (node_id, status);
    """,
    """
    ALTER TABLE runs ADD COLUMN rendezvous jsonb;         -- multi-node: master, node rank, nodes
    ALTER TABLE runs ADD COLUMN pid int;                  -- launcher pid = its process group
    ALTER TABLE runs ADD COLUMN pid_start bigint;         -- /proc start ticks: a recycled pid is not ours
    """,
    """
    -- a cancel seen here is remembered, so an assignment of the job that arrives after it
    -- (job.assigned and job.cancelled are different topics: no order between them) never runs
    CREATE TABLE cancelled_jobs (
        job_id       text PRIMARY KEY,
        tenant_id    text NOT NULL,
        attempt      int,                 -- the job's attempts when it was cancelled (None: older scheduler)
        cancelled_at timestamptz NOT NULL DEFAULT now()
    );
    """,
    """
    -- a gang's nodes run the same segment: a run is one node's part of it
    ALTER TABLE runs DROP CONSTRAINT runs_pkey;
    ALTER TABLE runs ADD PRIMARY KEY (segment_id, node_id);
    """,
    """
    -- a fence seen here is remembered, so an assignment of the fenced attempt that arrives after it
    -- (job.assigned and node.fenced are different topics: no order between them) never runs
    CREATE TABLE fenced_attempts (
        job_id       text NOT NULL,
        node_id      text NOT NULL,
        attempt      int  NOT NULL,
        fenced_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job_id, node_id, attempt)
    );
    """,
]
