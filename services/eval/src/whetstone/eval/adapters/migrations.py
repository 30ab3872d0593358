from whetstone.runtime.fencing import FENCES_DDL

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
    """
    ALTER TABLE jobs ADD COLUMN tier text;
    -- lineage is now tenant + base model sha + suffix; the accepted adapter is re-scored on new holdouts
    ALTER TABLE results ALTER COLUMN candidate_loss DROP NOT NULL;
    ALTER TABLE results ADD COLUMN adapter_uri text;
    ALTER TABLE results ADD COLUMN adapter_manifest_sha256 text;
    CREATE INDEX results_lineage ON results (lineage_key, created_at DESC) WHERE verdict = 'passed';
    -- one row per evaluation to do: claimed by a worker under a lease renewed by heartbeats
    CREATE TABLE eval_runs (
        job_id      text PRIMARY KEY,
        tenant_id   text NOT NULL,
        status      text NOT NULL DEFAULT 'pending',   -- pending | running | done
        attempts    int NOT NULL DEFAULT 0,
        lease_owner text,
        lease_until timestamptz,
        last_error  text,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX eval_runs_open ON eval_runs (created_at) WHERE status <> 'done';
    -- each finished stage, so a killed worker's successor resumes after it
    CREATE TABLE eval_stage_results (
        job_id   text NOT NULL,
        stage    text NOT NULL,
        result   jsonb NOT NULL,
        recorded_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job_id, stage)
    );
    -- base-model-side scores, computed once per base sha + inputs
    CREATE TABLE base_scores (
        key        text PRIMARY KEY,
        value      jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    """,
    """
    -- a run is a job's own evaluation (run_id = job_id) or an eval.requested command
    -- (run_id = 'request:<tenant>:<request_id>'): a job's first eval and its re-evaluations coexist
    ALTER TABLE eval_runs ADD COLUMN run_id text;
    UPDATE eval_runs SET run_id = job_id;
    ALTER TABLE eval_runs ALTER COLUMN run_id SET NOT NULL;
    ALTER TABLE eval_runs DROP CONSTRAINT eval_runs_pkey;
    ALTER TABLE eval_runs ADD PRIMARY KEY (run_id);
    CREATE INDEX eval_runs_job ON eval_runs (job_id);
    ALTER TABLE eval_runs ADD COLUMN request jsonb;     -- the eval.requested payload; NULL for a job's own run
    ALTER TABLE eval_runs ADD COLUMN trace_id text;
    ALTER TABLE eval_runs ADD COLUMN verdict text;      -- set when the answer is published
    ALTER TABLE eval_stage_results RENAME COLUMN job_id TO run_id;
    """,
    """
    -- an attempt that failed on an unreachable dependency (S3, Postgres) waits and is retried without
    -- spending one of its crash attempts, until the dependency has been out for transient_budget_s
    ALTER TABLE eval_runs ADD COLUMN not_before timestamptz;
    ALTER TABLE eval_runs ADD COLUMN transient_retries integer NOT NULL DEFAULT 0;
    ALTER TABLE eval_runs ADD COLUMN transient_since timestamptz;
    """,
    """
    -- issue 20: fencing. The job's newest final checkpoint (and its attempt) is the one evaluated; a
    -- fenced attempt's is refused; a newer attempt's gets its own run (run_id = job_id for attempt 1,
    -- job_id~a<N> after); a run whose attempt was fenced meanwhile ends 'superseded', publishing nothing
    ALTER TABLE final_checkpoints ADD COLUMN attempt int;
    """ + FENCES_DDL,
    """
    -- the user's model-name suffix (part of the lineage) in a column of its own; spec is the TrainingSpec
    ALTER TABLE jobs ADD COLUMN suffix text;
    UPDATE jobs SET suffix = spec->>'suffix';
    """,
]
