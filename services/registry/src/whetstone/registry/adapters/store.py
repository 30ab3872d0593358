"""ModelStore: the registry's Postgres repository — the only place with SQL; rows become the
domain's typed records here and nowhere else."""

from __future__ import annotations

import asyncpg

from whetstone.contracts.enums import ModelStage
from whetstone.contracts import EvalCompletedV1, Lineage

from ..domain.drift import FIRST_PIN_ACTOR, BaseModelEntry, BaseVersion, PinnedAdapter, ReevalRequest, ReevalStatus
from ..domain.lineage import FinalCheckpoint, LineageRecord, QueuedJob, RecordedEval, StoredLineage
from ..domain.merges import MergeRecord, MergeState
from ..domain.stages import ModelRecord, StageChange, Transition


def _model(row: asyncpg.Record) -> ModelRecord:
    return ModelRecord(**dict(row))


def _lineage(row: asyncpg.Record) -> StoredLineage:
    fields = dict(row)   # the lineage's columns, with the model's id and its model card's uri
    return StoredLineage(LineageRecord(**fields), fields.pop("model_card_uri"))


class ModelStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    # -- inputs of a registration ------------------------------------------------
    async def record_job(self, job: QueuedJob) -> None:
        await self.conn.execute(
            "INSERT INTO jobs (job_id, tenant_id, spec, suffix, job_template, job_template_version)"
            " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT DO NOTHING",
            job.job_id, job.tenant_id, job.spec.model_dump(mode="json"), job.suffix, job.job_template,
            job.job_template_version)

    async def record_final_checkpoint(self, c: FinalCheckpoint) -> None:
        """The job's final checkpoint; a newer attempt's replaces an older attempt's (never the reverse)."""
        await self.conn.execute(
            "INSERT INTO final_checkpoints (job_id, tenant_id, uri, manifest_sha256, step, segment_id, files,"
            " chat_template_sha256, adapter_config, environment, attempt, vision)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)"
            " ON CONFLICT (job_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, uri = EXCLUDED.uri,"
            " manifest_sha256 = EXCLUDED.manifest_sha256, step = EXCLUDED.step, segment_id = EXCLUDED.segment_id,"
            " files = EXCLUDED.files, chat_template_sha256 = EXCLUDED.chat_template_sha256,"
            " adapter_config = EXCLUDED.adapter_config, environment = EXCLUDED.environment, attempt = EXCLUDED.attempt,"
            " vision = EXCLUDED.vision WHERE coalesce(final_checkpoints.attempt, 1) < coalesce(EXCLUDED.attempt, 1)",
            c.job_id, c.tenant_id, c.uri, c.manifest_sha256, c.step, c.segment_id, c.files, c.chat_template_sha256,
            c.adapter_config, c.environment, c.attempt, c.vision.model_dump(mode="json") if c.vision else None)

    async def job(self, job_id: str) -> QueuedJob | None:
        row = await self.conn.fetchrow("SELECT job_id, tenant_id, spec, suffix, job_template, job_template_version"
                                       " FROM jobs WHERE job_id = $1", job_id)
        return QueuedJob(**dict(row)) if row else None

    async def final_attempt(self, job_id: str) -> int | None:
        attempt: int | None = await self.conn.fetchval("SELECT coalesce(attempt, 1) FROM final_checkpoints"
                                                       " WHERE job_id = $1", job_id)
        return attempt

    async def forget_fenced_checkpoint(self, job_id: str, tenant_id: str, fenced: int) -> bool:
        """A kept final checkpoint of a fenced attempt is not the job's result (unless a model was made of it)."""
        status = await self.conn.execute(
            "DELETE FROM final_checkpoints c WHERE job_id = $1 AND tenant_id = $2 AND coalesce(attempt, 1) <= $3"
            " AND NOT EXISTS (SELECT 1 FROM models m WHERE m.job_id = c.job_id)", job_id, tenant_id, fenced)
        return status.endswith(" 1")

    async def record_eval(self, tenant_id: str, ev: EvalCompletedV1) -> None:
        await self.conn.execute("INSERT INTO evals (job_id, tenant_id, verdict, event, checkpoint_uri)"
                                " VALUES ($1,$2,$3,$4,$5) ON CONFLICT DO NOTHING", ev.job_id, tenant_id, ev.verdict,
                                ev.model_dump(mode="json"), ev.checkpoint_uri)

    async def registration_parts(self, job_id: str) -> tuple[QueuedJob | None, FinalCheckpoint | None,
                                                              RecordedEval | None]:
        """The job, its kept final checkpoint and the verdict about that very checkpoint."""
        job = await self.job(job_id)
        row = await self.conn.fetchrow(
            "SELECT job_id, tenant_id, uri, manifest_sha256, step, segment_id, files, chat_template_sha256,"
            " adapter_config, environment, attempt, vision FROM final_checkpoints WHERE job_id = $1", job_id)
        if row is None:
            return job, None, None
        ckpt = FinalCheckpoint(**dict(row))
        ev = await self.conn.fetchrow("SELECT tenant_id, event FROM evals WHERE job_id = $1 AND checkpoint_uri = $2",
                                      job_id, ckpt.uri)
        return job, ckpt, RecordedEval(**dict(ev)) if ev else None

    async def insert_model(self, model_id: str, job_id: str, tenant_id: str, name: str, artifact_uri: str,
                           artifact_sha256: str, lineage: Lineage, files: dict[str, str],
                           fine_tuned_model: str) -> bool:
        return bool(await self.conn.fetchval(
            "INSERT INTO models (model_id, job_id, tenant_id, name, stage, artifact_uri, artifact_sha256, lineage, files,"
            " fine_tuned_model) VALUES ($1,$2,$3,$4,'dev',$5,$6,$7,$8,$9) ON CONFLICT DO NOTHING RETURNING 1",
            model_id, job_id, tenant_id, name, artifact_uri, artifact_sha256, lineage.model_dump(mode="json"), files,
            fine_tuned_model))

    async def fine_tuned_model_taken(self, tenant_id: str, fine_tuned_model: str, job_id: str) -> bool:
        """Another job of the tenant already registered under this public id."""
        return bool(await self.conn.fetchval(
            "SELECT 1 FROM models WHERE tenant_id = $1 AND fine_tuned_model = $2 AND job_id <> $3",
            tenant_id, fine_tuned_model, job_id))

    async def insert_lineage(self, model_id: str, r: LineageRecord, model_card_uri: str) -> None:
        await self.conn.execute(
            "INSERT INTO model_lineage (model_id, job_id, base_model, base_model_sha256, dataset_id, dataset_version,"
            " method, hyperparameters, hyperparameters_hash, training_run, checkpoint_step, job_template,"
            " job_template_version, job_template_missing_reason, environment, environment_sha256, eval_verdict,"
            " eval_metrics, eval_stages, files, chat_template_sha256, model_card_uri, vision)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23)",
            model_id, r.job_id, r.base_model, r.base_model_sha256, r.dataset_id, r.dataset_version, r.method,
            r.hyperparameters, r.hyperparameters_hash, r.training_run, r.checkpoint_step, r.job_template,
            r.job_template_version, r.job_template_missing_reason, r.environment, r.environment_sha256, r.eval_verdict,
            [m.model_dump(mode="json") for m in r.eval_metrics], [st.model_dump(mode="json") for st in r.eval_stages],
            r.files, r.chat_template_sha256, model_card_uri, r.vision.model_dump(mode="json") if r.vision else None)

    # -- models ------------------------------------------------------------------
    async def get(self, model_id: str, tenant_id: str | None = None, *, for_update: bool = False) -> ModelRecord | None:
        """One version by its internal id, or (with a tenant) by its public id (`fine_tuned_model`)."""
        row = await self.conn.fetchrow(
            "SELECT * FROM models WHERE (model_id = $1 OR ($2::text IS NOT NULL AND fine_tuned_model = $1))"
            " AND ($2::text IS NULL OR tenant_id = $2) ORDER BY model_id = $1 DESC LIMIT 1"
            + (" FOR UPDATE" if for_update else ""), model_id, tenant_id)
        return _model(row) if row else None

    async def resolve(self, ref: str, tenant_id: str) -> ModelRecord | None:
        """A version's public id (`fine_tuned_model`) or internal id, else a model name (the versions of a
        suffix): the name's production version, else its newest staging, dev, quarantined, archived one."""
        row = await self.conn.fetchrow(
            "SELECT * FROM models WHERE (model_id = $1 OR fine_tuned_model = $1 OR name = $1) AND tenant_id = $2"
            " ORDER BY (model_id = $1 OR fine_tuned_model IS NOT DISTINCT FROM $1) DESC,"
            " CASE stage WHEN 'production' THEN 0 WHEN 'staging' THEN 1 WHEN 'dev' THEN 2"
            " WHEN 'quarantined' THEN 3 ELSE 4 END, created_at DESC LIMIT 1", ref, tenant_id)
        return _model(row) if row else None

    async def page(self, tenant_id: str, *, job_id: str | None = None, name: str | None = None,
                   after: str | None = None, limit: int = 100) -> list[ModelRecord]:
        rows = await self.conn.fetch(
            "SELECT * FROM models WHERE tenant_id = $1 AND ($2::text IS NULL OR job_id = $2)"
            " AND ($3::text IS NULL OR name = $3 OR name = (SELECT name FROM models WHERE tenant_id = $1"
            "      AND fine_tuned_model = $3))"
            " AND ($4::text IS NULL OR (created_at, model_id) < (SELECT created_at, model_id FROM models"
            "      WHERE (model_id = $4 OR fine_tuned_model = $4) AND tenant_id = $1))"
            " ORDER BY created_at DESC, model_id DESC LIMIT $5", tenant_id, job_id, name, after, limit)
        return [_model(r) for r in rows]

    async def in_stages(self, stages: list[ModelStage]) -> list[ModelRecord]:
        rows = await self.conn.fetch("SELECT * FROM models WHERE stage = ANY($1::text[]) ORDER BY model_id", stages)
        return [_model(r) for r in rows]

    async def stored_lineage(self, model_id: str) -> StoredLineage | None:
        row = await self.conn.fetchrow("SELECT * FROM model_lineage WHERE model_id = $1", model_id)
        return _lineage(row) if row else None


    async def lock_name(self, tenant_id: str, name: str) -> None:
        """Serialise stage changes of one (tenant, name): at most one production version."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{tenant_id}/{name}")

    async def production_of(self, tenant_id: str, name: str) -> ModelRecord | None:
        row = await self.conn.fetchrow("SELECT * FROM models WHERE tenant_id = $1 AND name = $2"
                                       " AND stage = 'production'", tenant_id, name)
        return _model(row) if row else None

    async def previous_production(self, tenant_id: str, name: str, current_id: str) -> ModelRecord | None:
        """The version of the name that was in production most recently before `current_id`."""
        row = await self.conn.fetchrow(
            "SELECT m.* FROM stage_history h JOIN models m ON m.model_id = h.model_id"
            " WHERE m.tenant_id = $1 AND m.name = $2 AND h.to_stage = 'production' AND m.model_id <> $3"
            " AND m.stage = 'archived' ORDER BY h.id DESC LIMIT 1", tenant_id, name, current_id)
        return _model(row) if row else None

    async def apply(self, tenant_id: str, t: Transition, actor: str | None) -> int:
        """One stage change: the model row and its history row (never updated)."""
        await self.conn.execute("UPDATE models SET stage = $2 WHERE model_id = $1", t.model_id, t.to_stage)
        sequence: int = await self.conn.fetchval(
            "INSERT INTO stage_history (model_id, from_stage, to_stage, reason, approval, actor, replaces_model_id,"
            " tenant_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) RETURNING id",
            t.model_id, t.from_stage, t.to_stage, t.reason, t.approval, actor, t.replaces_model_id, tenant_id)
        return sequence

    async def history(self, model_id: str) -> list[StageChange]:
        rows = await self.conn.fetch("SELECT id, from_stage, to_stage, reason, approval, actor, replaces_model_id, at"
                                     " FROM stage_history WHERE model_id = $1 ORDER BY id", model_id)
        return [StageChange(**dict(r)) for r in rows]

    # -- base-model catalog --------------------------------------------------------
    async def observe_base(self, name: str, sha256: str, job_id: str) -> None:
        """A base first seen in a job enters the catalog at the SHA the job pinned."""
        added = await self.conn.fetchval("INSERT INTO base_models (name, sha256) VALUES ($1,$2)"
                                         " ON CONFLICT DO NOTHING RETURNING 1", name, sha256)
        if added:
            await self.conn.execute("INSERT INTO base_model_versions (name, sha256, reason, actor) VALUES ($1,$2,$3,$4)"
                                    " ON CONFLICT DO NOTHING", name, sha256, f"first pinned by job {job_id}",
                                    FIRST_PIN_ACTOR)

    async def base(self, name: str, *, for_update: bool = False) -> BaseModelEntry | None:
        row = await self.conn.fetchrow("SELECT name, sha256, previous_sha256, uri, updated_at FROM base_models"
                                       " WHERE name = $1" + (" FOR UPDATE" if for_update else ""), name)
        return BaseModelEntry(**dict(row)) if row else None

    async def bases(self) -> list[BaseModelEntry]:
        rows = await self.conn.fetch("SELECT name, sha256, previous_sha256, uri, updated_at FROM base_models"
                                     " ORDER BY name")
        return [BaseModelEntry(**dict(r)) for r in rows]

    async def base_versions(self, name: str) -> list[BaseVersion]:
        return [BaseVersion(**dict(r)) for r in await self.conn.fetch(
            "SELECT sha256, previous_sha256, uri, reason, actor, at FROM base_model_versions WHERE name = $1"
            " ORDER BY id", name)]

    async def publish_base_version(self, name: str, sha256: str, previous: str | None, uri: str | None, reason: str,
                                   actor: str) -> None:
        await self.conn.execute(
            "INSERT INTO base_models (name, sha256, previous_sha256, uri, updated_at) VALUES ($1,$2,$3,$4,now())"
            " ON CONFLICT (name) DO UPDATE SET sha256 = $2, previous_sha256 = $3, uri = $4, updated_at = now()",
            name, sha256, previous, uri)
        await self.conn.execute("INSERT INTO base_model_versions (name, sha256, previous_sha256, uri, reason, actor)"
                                " VALUES ($1,$2,$3,$4,$5,$6)", name, sha256, previous, uri, reason, actor)

    async def pinned_elsewhere(self, base_model: str, sha256: str) -> list[ModelRecord]:
        """Live models (not archived/quarantined) of this base pinned to another SHA."""
        rows = await self.conn.fetch(
            "SELECT m.* FROM models m JOIN model_lineage l USING (model_id) WHERE l.base_model = $1"
            " AND l.base_model_sha256 <> $2 AND m.stage IN ('dev', 'staging', 'production') ORDER BY m.model_id",
            base_model, sha256)
        return [_model(r) for r in rows]

    async def mark_needs_reeval(self, model_ids: list[str]) -> None:
        await self.conn.execute("UPDATE models SET needs_reeval = true WHERE model_id = ANY($1::text[])", model_ids)

    async def add_reeval(self, request_id: str, model_id: str, base_model: str, sha256: str) -> bool:
        return bool(await self.conn.fetchval(
            "INSERT INTO reevals (request_id, model_id, base_model, base_model_sha256, status)"
            " VALUES ($1,$2,$3,$4,'requested') ON CONFLICT DO NOTHING RETURNING 1",
            request_id, model_id, base_model, sha256))

    async def reeval(self, request_id: str) -> ReevalRequest | None:
        row = await self.conn.fetchrow("SELECT request_id, model_id, base_model, base_model_sha256, status"
                                       " FROM reevals WHERE request_id = $1", request_id)
        return ReevalRequest(**dict(row)) if row else None

    async def complete_reeval(self, request_id: str, model_id: str, status: ReevalStatus, reasons: list[str],
                              still_current: bool) -> None:
        await self.conn.execute("UPDATE reevals SET status = $2, reasons = $3, completed_at = now()"
                                " WHERE request_id = $1", request_id, status, reasons)
        if status == ReevalStatus.PASSED and still_current:
            await self.conn.execute("UPDATE models SET needs_reeval = false WHERE model_id = $1", model_id)

    async def production_adapters(self, base_model: str, sha256: str) -> list[PinnedAdapter]:
        rows = await self.conn.fetch(
            "SELECT m.model_id, m.tenant_id, m.name, m.stage, l.base_model_sha256, r.status AS reeval_status"
            " FROM models m"
            " JOIN model_lineage l USING (model_id)"
            " LEFT JOIN reevals r ON r.model_id = m.model_id AND r.base_model_sha256 = $2"
            " WHERE l.base_model = $1 AND m.stage = 'production' ORDER BY m.model_id", base_model, sha256)
        return [PinnedAdapter(**dict(r)) for r in rows]

    # -- artifacts ---------------------------------------------------------------
    async def verified(self, uri: str) -> tuple[str, str] | None:
        row = await self.conn.fetchrow("SELECT etag, sha256 FROM verified_objects WHERE uri = $1", uri)
        return (row[0], row[1]) if row else None

    async def remember_verified(self, uri: str, etag: str, sha256: str) -> None:
        await self.conn.execute("INSERT INTO verified_objects (uri, etag, sha256) VALUES ($1,$2,$3) ON CONFLICT (uri)"
                                " DO UPDATE SET etag = $2, sha256 = $3, verified_at = now()", uri, etag, sha256)

    async def merge(self, model_id: str) -> MergeRecord | None:
        row = await self.conn.fetchrow("SELECT merge_id, model_id, tenant_id, status, uri, manifest_sha256, files,"
                                       " merge_job_id, error FROM merges WHERE model_id = $1", model_id)
        return MergeRecord(**dict(row)) if row else None

    async def add_merge(self, merge_id: str, model_id: str, tenant_id: str, status: MergeState, uri: str | None = None,
                        manifest_sha256: str | None = None, files: dict[str, str] | None = None) -> bool:
        return bool(await self.conn.fetchval(
            "INSERT INTO merges (merge_id, model_id, tenant_id, status, uri, manifest_sha256, files)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT DO NOTHING RETURNING 1",
            merge_id, model_id, tenant_id, status, uri, manifest_sha256, files or {}))

    async def retry_merge(self, model_id: str, failed_id: str, merge_id: str) -> bool:
        """The failed merge becomes a new request under a new id (once, whoever asks first)."""
        return bool(await self.conn.fetchval(
            "UPDATE merges SET merge_id = $3, status = 'requested', uri = NULL, manifest_sha256 = NULL, files = '{}',"
            " merge_job_id = NULL, error = NULL, completed_at = NULL"
            " WHERE model_id = $1 AND merge_id = $2 AND status = 'failed' RETURNING 1", model_id, failed_id, merge_id))

    async def complete_merge(self, merge_id: str, status: MergeState, uri: str | None, manifest_sha256: str | None,
                             files: dict[str, str], merge_job_id: str | None, error: str | None,
                             tenant_id: str) -> bool:
        """The tenant's requested merge, answered once (another tenant's answer changes nothing)."""
        return bool(await self.conn.fetchval(
            "UPDATE merges SET status = $2, uri = $3, manifest_sha256 = $4, files = $5, merge_job_id = $6, error = $7,"
            " completed_at = now() WHERE merge_id = $1 AND status = 'requested' AND tenant_id = $8 RETURNING 1",
            merge_id, status, uri, manifest_sha256, files, merge_job_id, error, tenant_id))
