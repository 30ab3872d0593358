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

# 2: lineage that cannot be incomplete, append-only stage history, base-model catalog,
# re-evaluation, artifact verification, merge requests.
MIGRATIONS.append(
    """
    ALTER TABLE jobs ADD COLUMN suffix text, ADD COLUMN job_template text, ADD COLUMN job_template_version text;
    ALTER TABLE final_checkpoints ADD COLUMN segment_id text NOT NULL DEFAULT '',
        ADD COLUMN files jsonb NOT NULL DEFAULT '{}'::jsonb, ADD COLUMN chat_template_sha256 text,
        ADD COLUMN adapter_config jsonb, ADD COLUMN environment jsonb;
    ALTER TABLE models ADD COLUMN needs_reeval boolean NOT NULL DEFAULT false,
        ADD COLUMN files jsonb NOT NULL DEFAULT '{}'::jsonb;
    CREATE UNIQUE INDEX models_one_production ON models (tenant_id, name) WHERE stage = 'production';
    CREATE INDEX models_by_name ON models (tenant_id, name, created_at);

    CREATE TABLE model_lineage (
        model_id              text PRIMARY KEY REFERENCES models (model_id),
        job_id                text NOT NULL CHECK (job_id <> ''),
        base_model            text NOT NULL CHECK (base_model <> ''),
        base_model_sha256     text NOT NULL CHECK (base_model_sha256 <> ''),
        dataset_id            text NOT NULL CHECK (dataset_id <> ''),
        dataset_version       text NOT NULL CHECK (dataset_version <> ''),
        method                text NOT NULL,
        hyperparameters       jsonb NOT NULL,
        hyperparameters_hash  text NOT NULL CHECK (hyperparameters_hash <> ''),
        training_run          text NOT NULL CHECK (training_run <> ''),
        checkpoint_step       int NOT NULL,
        job_template          text,
        job_template_version  text,
        job_template_missing_reason text,
        environment           jsonb NOT NULL,
        environment_sha256    text NOT NULL,
        eval_verdict          text NOT NULL,
        eval_metrics          jsonb NOT NULL,
        eval_stages           jsonb NOT NULL,
        files                 jsonb NOT NULL CHECK (jsonb_typeof(files) = 'object' AND files <> '{}'::jsonb),
        chat_template_sha256  text,
        model_card_uri        text NOT NULL,
        CHECK ((job_template IS NOT NULL AND job_template_version IS NOT NULL)
               OR job_template_missing_reason IS NOT NULL)
    );

    ALTER TABLE stage_history ADD COLUMN approval text, ADD COLUMN actor text,
        ADD COLUMN replaces_model_id text, ADD COLUMN tenant_id text;
    CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
    END $$;
    CREATE TRIGGER stage_history_append_only BEFORE UPDATE OR DELETE ON stage_history
        FOR EACH ROW EXECUTE FUNCTION refuse_change();
    CREATE TRIGGER stage_history_no_truncate BEFORE TRUNCATE ON stage_history
        FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();

    CREATE TABLE base_models (
        name        text PRIMARY KEY,
        sha256      text NOT NULL,
        previous_sha256 text,
        uri         text,
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE base_model_versions (
        id          bigserial PRIMARY KEY,
        name        text NOT NULL,
        sha256      text NOT NULL,
        previous_sha256 text,
        uri         text,
        reason      text NOT NULL,
        actor       text NOT NULL,
        at          timestamptz NOT NULL DEFAULT now(),
        UNIQUE (name, sha256)
    );
    CREATE TRIGGER base_model_versions_append_only BEFORE UPDATE OR DELETE ON base_model_versions
        FOR EACH ROW EXECUTE FUNCTION refuse_change();

    CREATE TABLE reevals (
        request_id  text PRIMARY KEY,
        model_id    text NOT NULL REFERENCES models (model_id),
        base_model  text NOT NULL,
        base_model_sha256 text NOT NULL,
        status      text NOT NULL,
        reasons     jsonb NOT NULL DEFAULT '[]'::jsonb,
        requested_at timestamptz NOT NULL DEFAULT now(),
        completed_at timestamptz,
        UNIQUE (model_id, base_model_sha256)
    );

    CREATE TABLE verified_objects (
        uri         text PRIMARY KEY,
        etag        text NOT NULL,
        sha256      text NOT NULL,
        verified_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE merges (
        merge_id    text PRIMARY KEY,
        model_id    text NOT NULL UNIQUE REFERENCES models (model_id),
        tenant_id   text NOT NULL,
        status      text NOT NULL,
        uri         text,
        manifest_sha256 text,
        files       jsonb NOT NULL DEFAULT '{}'::jsonb,
        merge_job_id text,
        error       text,
        requested_at timestamptz NOT NULL DEFAULT now(),
        completed_at timestamptz
    );
    """
)

# 3: the tenant each input event came from (a model's three inputs must agree on it)
MIGRATIONS.append(
    """
    ALTER TABLE final_checkpoints ADD COLUMN tenant_id text;
    ALTER TABLE evals ADD COLUMN tenant_id text;
    """
)

# 4: fencing. The final checkpoint kept is the newest attempt's; a fenced attempt's is
# refused or dropped; a verdict counts only for the very checkpoint it names (one row per checkpoint)
MIGRATIONS.append(
    """
    ALTER TABLE final_checkpoints ADD COLUMN attempt int;
    ALTER TABLE evals ADD COLUMN checkpoint_uri text;
    UPDATE evals SET checkpoint_uri = coalesce(event->>'checkpoint_uri', '');
    ALTER TABLE evals ALTER COLUMN checkpoint_uri SET NOT NULL;
    ALTER TABLE evals DROP CONSTRAINT evals_pkey;
    ALTER TABLE evals ADD PRIMARY KEY (job_id, checkpoint_uri);
    """ + FENCES_DDL
)

# 5: OpenAI's model ids: a version's public id is its job's `fine_tuned_model` name
# (naming.fine_tuned_model_for), unique per tenant; rows registered before keep their model_id as id
MIGRATIONS.append(
    """
    ALTER TABLE models ADD COLUMN fine_tuned_model text;
    CREATE UNIQUE INDEX models_fine_tuned_model ON models (tenant_id, fine_tuned_model)
        WHERE fine_tuned_model IS NOT NULL;
    """
)

# 6: a vision adapter's processor and image settings (the trainer's whetstone_training.json "vision"),
# kept with its final checkpoint and in its lineage
MIGRATIONS.append(
    """
    ALTER TABLE final_checkpoints ADD COLUMN vision jsonb;
    ALTER TABLE model_lineage ADD COLUMN vision jsonb;
    """
)

# 7: experiment tracking (a job's `mlflow` integration): one run per tracked job (its id stored once made)
# and the items still to send to it, each once (keyed: a redelivered event adds nothing)
MIGRATIONS.append(
    """
    CREATE TABLE tracked_runs (
        job_id text PRIMARY KEY,
        tenant_id text NOT NULL,
        experiment text NOT NULL,
        run_name text NOT NULL,
        start_ms bigint NOT NULL,
        experiment_id text,
        run_id text,
        given_up boolean NOT NULL DEFAULT false,
        attempts int NOT NULL DEFAULT 0,
        last_error text,
        next_try_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE tracking_items (
        job_id text NOT NULL REFERENCES tracked_runs (job_id),
        item text NOT NULL,
        seq bigserial,
        body jsonb NOT NULL,
        sent_at timestamptz,
        PRIMARY KEY (job_id, item)
    );
    CREATE INDEX tracking_items_unsent ON tracking_items (job_id, seq) WHERE sent_at IS NULL;
    """
)

# 8: a step read before its job's job.queued (each topic is consumed on its own) is kept until job.queued
# says whether the job is tracked: items no longer need their run's row
MIGRATIONS.append(
    """
    ALTER TABLE tracking_items DROP CONSTRAINT tracking_items_job_id_fkey;
    """
)
