"""A segment's scratch directory on this node: the base model check, the distributed plan, the
data and the checkpoint to resume from (downloaded and verified), the recipe's CONFIG.json and
the launch command. Blocking IO: run it in a thread."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from whetstone.contracts.enums import Method
from whetstone.runtime.models import ResolvedModel, UnknownModel, is_hub_id, resolve_model
from whetstone.runtime.s3 import ObjectStore

from ..config import TrainerAgentSettings
from ..domain.distributed import (
    DistributedPlan,
    Topology,
    deepspeed_config,
    plan_distributed,
    requested_zero_stage,
    training_mode,
)
from ..domain.launch import COLLECTIVE_TIMEOUT_ENV, NODE_ID_ENV, LaunchSpec, build_launch, resolve_rendezvous
from ..domain.recipe_io import DistributedSummary, RecipeReinforcement, TrainingConfig
from ..domain.runs import Run
from .checkpoint_store import ResumePoint, S3Checkpoints
from .model_size import param_count


@dataclass(frozen=True)
class Prepared:
    launch: LaunchSpec
    plan: DistributedPlan
    resume: ResumePoint
    node_rank: int


def pinned_base(ref: str, sha256: str, catalog: Path) -> ResolvedModel:
    """The base model exactly as admission pinned it. A catalog model or local directory: its weights
    must still hash to `sha256`. A Hub id: `sha256` is the Hub commit recorded at admission, and the
    child loads that commit's snapshot directory (downloaded once into the Hugging Face cache, or
    found there offline), never the repository's current head. UnknownModel names what is missing."""
    local = catalog / ref if not ref.startswith(("/", ".")) else Path(ref)
    if (local / "config.json").is_file() or not is_hub_id(ref):
        model = resolve_model(ref, catalog)
        if model.sha256 != sha256:
            raise UnknownModel(f"base model {ref} on this node has sha256 {model.sha256[:12]}…, "
                               f"job pinned {sha256[:12]}…")
        return model
    from huggingface_hub import snapshot_download  # noqa: PLC0415
    try:
        snapshot = snapshot_download(ref, revision=sha256)
    except Exception as exc:   # the revision is gone (force-push, deleted repo), or the Hub is unreachable
        raise UnknownModel(f"model: Hub base {ref!r} at the revision pinned at admission ({sha256}) cannot be "
                           f"fetched ({type(exc).__name__}: {str(exc)[:200]})") from exc
    return ResolvedModel(ref, snapshot, sha256, True)


class Workspaces:
    """Scratch directories under `<scratch_root>/<segment id>`."""

    def __init__(self, config: TrainerAgentSettings, root: Path, model_catalog: Path, store: ObjectStore,
                 checkpoints: S3Checkpoints) -> None:
        self.config, self.root, self.model_catalog = config, root, model_catalog
        self.store, self.checkpoints = store, checkpoints

    def path(self, segment_id: str) -> Path:
        return self.root / segment_id

    def remove(self, segment_ids: Iterable[str]) -> None:
        if self.config.keep_scratch:
            return
        for segment_id in segment_ids:
            shutil.rmtree(self.path(segment_id), ignore_errors=True)

    def prepare(self, run: Run) -> Prepared:
        """Check the model pin, decide the distributed plan (rejecting impossible ones before any
        download), fence older attempts off the job's checkpoints, fetch data and the checkpoint to
        resume from, write the recipe config and launch. StaleAttempt when a newer attempt started."""
        c, spec, scratch = self.config, run.spec, self.path(run.segment_id)
        scratch.mkdir(parents=True, exist_ok=True)
        model = pinned_base(spec.base_model, spec.base_model_sha256, self.model_catalog)
        hyper = spec.hyperparameters
        rendezvous = resolve_rendezvous(run.rendezvous, run.segment_id)
        gpu_node = c.gpu_type != "cpu"
        topology = Topology(nodes=rendezvous.nodes if rendezvous else 1, gpus_per_node=max(len(run.gpu_ids), 1),
                            gpu_node=gpu_node, gpu_memory_gb=c.gpu_memory_gb)
        plan = plan_distributed(training_mode(spec.method, hyper), param_count(model.location), topology,
                                requested_zero_stage(hyper))
        train = self.store.download_file(spec.train_uri, scratch / "data" / "train.jsonl")
        val = self.store.download_file(spec.validation_uri, scratch / "data" / "validation.jsonl") \
            if spec.validation_uri else None
        self.checkpoints.claim(run.fence)  # from now on, older attempts of the job may not write checkpoints
        resume = self.checkpoints.resume_point(run.tenant_id, run.job_id, run.resume_from, scratch / "resume")
        ds_config = deepspeed_config(plan)
        ds_path = scratch / "deepspeed.json"
        if ds_config:
            ds_path.write_text(ds_config.model_dump_json(indent=1))
        config = TrainingConfig(
            job_id=run.job_id, base_model=model.location, train_file=train, validation_file=val,
            output_dir=scratch / "out", method=Method(spec.method), hyperparameters=hyper,
            reinforcement=RecipeReinforcement.model_validate(spec.reinforcement.model_dump())
            if spec.reinforcement else None,
            resume_from=resume.path, deepspeed=ds_path if ds_config else None, zero_init=plan.zero_init,
            distributed=DistributedSummary(world_size=plan.world_size, zero_stage=plan.zero_stage,
                                           reasons=list(plan.reasons)),
            max_shard_bytes=c.full_weights_max_shard_bytes)
        config_path = scratch / "config.json"
        config_path.write_text(config.model_dump_json(indent=1))
        launch = build_launch(
            python=sys.executable, module=c.recipe_module, config_path=str(config_path), plan=plan,
            gpu_ids=list(run.gpu_ids), gpu_node=gpu_node, key=run.segment_id, rendezvous=rendezvous,
            launcher=c.launcher, shutdown_timeout_s=int(c.drain_timeout_s), hostfile_path=str(scratch / "hostfile"),
            extra_env={"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                       COLLECTIVE_TIMEOUT_ENV: str(c.collective_timeout_s), NODE_ID_ENV: c.node_id},
            join_timeout_s=c.collective_timeout_s)
        if launch.hostfile:
            (scratch / "hostfile").write_text(launch.hostfile)
        return Prepared(launch, plan, resume, rendezvous.node_rank if rendezvous else 0)
