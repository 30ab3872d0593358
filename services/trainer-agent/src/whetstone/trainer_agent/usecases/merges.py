"""Merge jobs on this node (method `merge`: a registered adapter merged into its base, on request).

The agent runs them as segments like any job, so they are fenced, cancelled, preempted and
billed the same way (job.started, then job.completed or job.failed). What differs:
- `prepare_merge`: no training data; the adapter is downloaded with the runtime's verified
  download against its pinned manifest sha256 (a missing or altered file: CorruptCheckpoint),
  and the launch runs `recipes.merge`;
- `on_merged`: the merged directory is uploaded with the checkpoint store's upload (files, then
  the per-file sha256 manifest) under the model's prefix, one prefix per attempt;
- the job's terminal event carries `model.merged` with it (succeeded with the files, or failed
  with the error), in the same transaction, for the registry.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from whetstone.contracts import CheckpointRef, MergeSource, ModelMergedV1
from whetstone.contracts.enums import MergeStatus
from whetstone.runtime.checkpoints import download_checkpoint, read_manifest
from whetstone.runtime.models import UnknownModel, resolve_model

from ..adapters.checkpoint_store import ResumePoint
from ..adapters.workspace import Prepared, Workspaces
from ..domain.checkpoints import StaleAttempt
from ..domain.distributed import DistributedPlan
from ..domain.launch import build_launch
from ..domain.recipe_io import MergeConfig, Merged
from ..domain.runs import Run

if TYPE_CHECKING:
    from .segments import AgentRuntime, Segment

MERGE_RECIPE = "whetstone.trainer_agent.recipes.merge"
# what the merge needs of the adapter artifact (never a pickle): the adapter, its tokenizer and template
ADAPTER_INPUTS = ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
                  "tokenizer.model", "special_tokens_map.json", "chat_template.jinja")


def merge_source(run: Run) -> MergeSource:
    if run.spec.merge is None:
        raise ValueError(f"merge job {run.job_id}: its spec names no adapter (spec.merge)")
    return run.spec.merge


def merged_prefix(tenant_id: str, model_id: str, segment_id: str) -> str:
    """Under the model's prefix, one per attempt: a fenced attempt's upload never touches the next one's."""
    return f"tenants/{tenant_id}/models/{model_id}/merged/{segment_id}"


def prepare_merge(ws: Workspaces, run: Run) -> Prepared:
    """Blocking (downloads): run it in a thread. UnknownModel when the pinned base is not on this node,
    CorruptCheckpoint when the adapter does not verify, StaleAttempt when a newer attempt started."""
    spec, scratch = run.spec, ws.path(run.segment_id)
    source = merge_source(run)
    scratch.mkdir(parents=True, exist_ok=True)
    model = resolve_model(spec.base_model, ws.model_catalog)
    if model.sha256 != spec.base_model_sha256:
        raise UnknownModel(f"base model {spec.base_model} on this node has sha256 {model.sha256[:12]}…, "
                           f"the adapter was trained on {spec.base_model_sha256[:12]}…")
    ws.checkpoints.claim(run.fence)
    adapter = scratch / "adapter"
    shutil.rmtree(adapter, ignore_errors=True)
    manifest, _ = read_manifest(ws.store, source.adapter_uri, source.adapter_manifest_sha256)
    wanted = [name for name in ADAPTER_INPUTS if name in manifest.files]
    download_checkpoint(ws.store, source.adapter_uri, adapter, manifest=manifest, only=wanted)
    config = MergeConfig(job_id=run.job_id, base_model=model.location, adapter_dir=adapter,
                         output_dir=scratch / "merged", merge_id=source.merge_id, model_id=source.model_id)
    config_path = scratch / "config.json"
    config_path.write_text(config.model_dump_json(indent=1))
    plan = DistributedPlan(mode="lora", world_size=1, zero_stage=None, reasons=("merge: one plain process",))
    gpu_node = ws.config.gpu_type != "cpu"
    launch = build_launch(python=sys.executable, module=MERGE_RECIPE, config_path=str(config_path), plan=plan,
                          gpu_ids=list(run.gpu_ids)[:1], gpu_node=gpu_node, key=run.segment_id,
                          extra_env={"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
    return Prepared(launch, plan, ResumePoint(None), 0)


def failed(run: Run, code: str, message: str) -> list[ModelMergedV1]:
    """The registry's answer when a merge job's segment fails (nothing for a training job)."""
    if not run.is_merge:
        return []
    source = merge_source(run)
    return [ModelMergedV1(merge_id=source.merge_id, model_id=source.model_id, status=MergeStatus.FAILED,
                          merge_job_id=run.job_id, error=f"{code}: {message}")]


async def on_merged(rt: AgentRuntime, seg: Segment, merged: Merged, scratch: Path) -> None:
    """Upload the merged directory (files, then the manifest, whose per-file sha256 the event carries),
    and keep `model.merged` for the segment's job.completed. A failed upload
    leaves `seg.final` unset: the `completed` that follows then fails the job."""
    ctx, run = rt.ctx, seg.run
    source = merge_source(run)
    prefix = merged_prefix(seg.tenant_id, source.model_id, seg.segment_id)
    meta = {"job_id": seg.job_id, "tenant_id": seg.tenant_id, "merge_id": source.merge_id,
            "model_id": source.model_id, "adapter_manifest_sha256": source.adapter_manifest_sha256}
    if seg.cancelled or seg.fenced_by_scheduler:
        return

    def upload() -> tuple[str, str, dict[str, str]]:
        up = ctx.checkpoints.upload_snapshot(merged.path, scratch / "uploading" / "merged", prefix, meta,
                                             fence=run.fence, attempts=ctx.config.upload_attempts,
                                             outage_budget_s=ctx.config.final_upload_outage_s)
        return up.uri, up.manifest_sha256, up.manifest.sha256s()

    try:
        uri, digest, files = await asyncio.to_thread(upload)
    except StaleAttempt as exc:
        rt.log.error("a newer attempt of the merge took over; stopping this segment", job_id=seg.job_id, error=str(exc))
        seg.fenced = seg.final_error = str(exc)
        seg.signal(signal.SIGKILL)
        return
    except Exception as exc:  # noqa: BLE001 - reported by the `completed` that follows (no final weights)
        rt.log.error("merged weights not uploaded", job_id=seg.job_id, error=f"{type(exc).__name__}: {exc}")
        seg.final_error = f"merged weights upload failed: {type(exc).__name__}: {exc}"
        return
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch / "uploading", True)
    seg.final = CheckpointRef(uri=uri, step=1, manifest_sha256=digest)
    seg.outcome = [ModelMergedV1(merge_id=source.merge_id, model_id=source.model_id, status=MergeStatus.SUCCEEDED,
                                 uri=uri,
                                 manifest_sha256=digest, files=files, merge_job_id=seg.job_id)]
    rt.log.info("merged weights stored", job_id=seg.job_id, merge_id=source.merge_id, uri=uri, files=len(files))
