"""Lineage of a model, its model card and the files a user may take away. Pure: no IO."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator
from pydantic.dataclasses import dataclass as record

from whetstone.contracts import EvalCompletedV1, EvalStageResult, Lineage, Metric, TrainingSpec
from whetstone.contracts.artifacts import ArtifactManifest
from whetstone.runtime.weights import holds_full_weights

# never served: pickles execute code on load
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


NO_TEMPLATE = "the job was not created from a job template"


class VisionSettings(BaseModel):
    """The processor and image settings a vision adapter was trained with (a server must feed images the
    same way), as the trainer's summary `whetstone_training.json` records them under "vision"."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    processor_class: str
    image_processor_class: str
    image_token: str | None = None
    patch_size: int | None = None
    vision_feature_select_strategy: str | None = None
    size: JsonValue = None              # the image processor's resize setting, as it wrote it
    crop_size: JsonValue = None         # {"height", "width"}: the image the vision tower sees
    tokens_per_image: int | None = None
    vision_tower: Literal["frozen", "lora"]
    packing: bool = False
    images_trained: int | None = None

    @property
    def tower_image_size(self) -> tuple[int, int] | None:
        """(height, width) the vision tower sees, from the crop (else the resize) setting."""
        for setting in (self.crop_size, self.size):
            if isinstance(setting, dict):
                height, width = setting.get("height"), setting.get("width")
                if isinstance(height, int) and isinstance(width, int):
                    return height, width
        return None

    def view(self) -> VisionView:
        size = self.tower_image_size
        return VisionView(**self.model_dump(), image_size=list(size) if size else None)


class VisionView(VisionSettings):
    """The vision settings as the models API shows them, with the (height, width) the tower sees."""

    image_size: list[int] | None = None


class TrainingSummary(BaseModel):
    """`whetstone_training.json` of a final checkpoint, as far as lineage reads it."""

    model_config = ConfigDict(extra="ignore")

    vision: VisionSettings | None = None


def training_summary(data: bytes | None) -> TrainingSummary:
    """The trainer's summary (an empty one when the artifact has none); ValueError when unreadable."""
    return TrainingSummary() if data is None else TrainingSummary.model_validate_json(data)


class IncompleteLineage(Exception):
    """A lineage that lacks a required part (not a ValueError: validation passes it through unwrapped)."""


@record(frozen=True)
class QueuedJob:
    """What job.queued told the registry about a job: its resolved spec and naming inputs."""

    job_id: str
    tenant_id: str
    spec: TrainingSpec
    suffix: str | None
    job_template: str | None
    job_template_version: str | None


@record(frozen=True)
class FinalCheckpoint:
    """The job's kept final checkpoint (the newest attempt's), with the small files lineage reads."""

    job_id: str
    tenant_id: str | None
    uri: str
    manifest_sha256: str
    step: int
    segment_id: str
    files: dict[str, str]
    chat_template_sha256: str | None
    adapter_config: dict[str, Any] | None   # PEFT's adapter_config.json as the trainer wrote it
    environment: dict[str, Any] | None      # the artifact's environment.lock.json
    attempt: int | None
    vision: VisionSettings | None = None    # a vision adapter's processor and image settings


@record(frozen=True)
class RecordedEval:
    """The eval verdict about one checkpoint, from the tenant that sent it."""

    tenant_id: str | None
    event: EvalCompletedV1


class LineageFields(BaseModel):
    """What made a model, as the kept lineage and the models API's view of it both hold it."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    base_model: str
    base_model_sha256: str
    dataset_id: str
    dataset_version: str
    method: str
    hyperparameters: dict[str, Any]     # the job spec's resolved hyperparameters, as trained
    hyperparameters_hash: str
    training_run: str
    checkpoint_step: int
    job_template: str | None
    job_template_version: str | None
    job_template_missing_reason: str | None
    environment: dict[str, Any]         # the environment lockfile the weights were made in
    environment_sha256: str
    eval_verdict: str
    eval_metrics: list[Metric]
    eval_stages: list[EvalStageResult]
    files: dict[str, str]
    chat_template_sha256: str | None = None


class LineageRecord(LineageFields):
    """Everything that made a model; every field is required (the job template may be missing
    only with a reason, until job templates exist)."""

    eval_reasons: list[str] = Field(default_factory=list)
    vision: VisionSettings | None = None

    @model_validator(mode="after")
    def _complete(self) -> LineageRecord:
        required = ("job_id", "base_model", "base_model_sha256", "dataset_id", "dataset_version", "method",
                    "hyperparameters_hash", "training_run", "environment_sha256", "eval_verdict")
        values = dict(self)
        missing = [n for n in required if not values[n]]
        if not self.files:
            missing.append("files")
        if not (self.job_template and self.job_template_version) and not self.job_template_missing_reason:
            missing.append("job_template (or the reason it is missing)")
        if missing:
            raise IncompleteLineage(f"lineage of {self.job_id} lacks {', '.join(missing)}")
        return self

    def wire(self) -> Lineage:
        """The lineage model.registered announces (and the models row keeps)."""
        return Lineage(job_id=self.job_id, base_model=self.base_model, base_model_sha256=self.base_model_sha256,
                       dataset_id=self.dataset_id, dataset_version=self.dataset_version, method=self.method,
                       hyperparameters_hash=self.hyperparameters_hash, eval_verdict=self.eval_verdict,
                       eval_metrics=self.eval_metrics, eval_stages=self.eval_stages, training_run=self.training_run,
                       checkpoint_step=self.checkpoint_step, job_template=self.job_template,
                       job_template_version=self.job_template_version, chat_template_sha256=self.chat_template_sha256,
                       environment_sha256=self.environment_sha256)


@dataclass(frozen=True)
class StoredLineage:
    """A registered model's lineage as kept, with where its model card is."""

    record: LineageRecord
    model_card_uri: str

    def view(self) -> LineageView:
        """The lineage as the models API shows it: the record's fields, its model card, the vision view."""
        shared = {name: value for name, value in self.record if name in LineageFields.model_fields}
        vision = self.record.vision
        return LineageView(**shared, model_card_uri=self.model_card_uri, vision=vision.view() if vision else None)


class LineageView(LineageFields):
    """A model's lineage as the models API shows it (`lineage` of a model's detail)."""

    model_card_uri: str
    vision: VisionView | None


def build_lineage(job: QueuedJob, ckpt: FinalCheckpoint, evaluation: EvalCompletedV1,
                  environment: dict[str, Any]) -> LineageRecord:
    """The lineage of the model made of `ckpt`, read once from the job's typed spec, the checkpoint
    and the verdict about it. IncompleteLineage when a part is missing."""
    spec = job.spec
    return LineageRecord(
        job_id=job.job_id, base_model=spec.base_model, base_model_sha256=spec.base_model_sha256,
        dataset_id=spec.dataset_id, dataset_version=spec.dataset_version, method=spec.method,
        hyperparameters=spec.hyperparameters, hyperparameters_hash=spec.hyperparameters_hash,
        training_run=ckpt.segment_id or f"{job.job_id}:final", checkpoint_step=ckpt.step,
        job_template=job.job_template, job_template_version=job.job_template_version,
        job_template_missing_reason=None if job.job_template and job.job_template_version else NO_TEMPLATE,
        environment=environment, environment_sha256=environment_sha256(environment),
        eval_verdict=evaluation.verdict, eval_metrics=list(evaluation.metrics), eval_stages=list(evaluation.stages),
        eval_reasons=list(evaluation.reasons), files=ckpt.files, chat_template_sha256=ckpt.chat_template_sha256,
        vision=ckpt.vision)


def file_manifest(manifest: bytes) -> dict[str, str]:
    """checkpoint manifest.json -> {relative path: sha256}. ValueError when unreadable or it lists no files."""
    files = ArtifactManifest.model_validate_json(manifest).sha256s()
    if not files:
        raise ValueError("manifest lists no files")
    return files


def pickles(files: dict[str, str]) -> list[str]:
    return [f for f in files if f.lower().endswith(PICKLE_SUFFIXES)]


def chat_template_sha256(template: str | None) -> str | None:
    return hashlib.sha256(template.encode()).hexdigest() if template else None


def hub_revision(base_model: str, base_model_sha256: str) -> str | None:
    """The Hub commit a base was pinned to: a Hub base (`org/name`) is pinned by its 40-hex commit,
    a local catalog base by the sha256 (64 hex) of its weights, which no Hub resolves."""
    return base_model_sha256 if "/" in base_model and re.fullmatch(r"[0-9a-f]{40}", base_model_sha256 or "") else None


def served_adapter_config(config: dict[str, Any], served_base: str, revision: str | None = None) -> dict[str, Any]:
    """adapter_config.json as a server (and PEFT's AutoPeftModel) expects it: `base_model_name_or_path`
    names the served base (PEFT writes the local training path, or null) and, for a Hub base, `revision`
    the commit it was pinned to, which AutoPeftModel passes on when it loads the base. A local catalog
    base is written as its catalog name: it resolves where a copy of the base sits under that path."""
    out = dict(config)
    out["base_model_name_or_path"] = served_base
    if revision:
        out["revision"] = revision
    out.setdefault("peft_type", "LORA")
    return out


def environment_sha256(environment: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(environment, sort_keys=True).encode()).hexdigest()


def model_card(model_id: str, name: str, tenant_id: str, lineage: LineageRecord) -> str:
    """A Hugging Face model card: YAML front matter (base_model, datasets, model-index) + prose. A full-weight
    model (full fine-tune, continued pre-training) is a `transformers` fine-tune of its base, an adapter a `peft` one."""
    full = holds_full_weights(lineage.files)
    results = []
    measured = [(s.name, s.metrics) for s in lineage.eval_stages] or [("gate", lineage.eval_metrics)]
    for stage_name, stage_metrics in measured:
        metrics = [{"type": m.name, "name": m.name, "value": m.candidate,
                    **({"args": {"base": m.base}} if m.base is not None else {})}
                   for m in stage_metrics]
        if metrics:
            results.append({"task": {"type": "text-generation", "name": stage_name},
                            "dataset": {"type": lineage.dataset_id, "name": lineage.dataset_id,
                                        "revision": lineage.dataset_version},
                            "metrics": metrics})
    front = {
        "base_model": lineage.base_model,
        "base_model_relation": "finetune" if full else "adapter",
        "library_name": "transformers" if full else "peft",
        "datasets": [lineage.dataset_id],
        "tags": ["whetstone", lineage.method, *(["vision"] if lineage.vision else [])],
        **({"pipeline_tag": "image-text-to-text"} if lineage.vision else {}),
        "model-index": [{"name": name, "results": results}],
    }
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", f"# {name}", "",
             f"Fine-tuned by Whetstone for tenant `{tenant_id}` (model id `{model_id}`, job `{lineage.job_id}`).", "",
             "## Lineage", "",
             f"- base model: `{lineage.base_model}` pinned at sha256 `{lineage.base_model_sha256}`",
             f"- dataset: `{lineage.dataset_id}` version `{lineage.dataset_version}`",
             f"- method: {lineage.method}; hyperparameters sha256 `{lineage.hyperparameters_hash}`",
             f"- training run: `{lineage.training_run}`, final step {lineage.checkpoint_step}",
             "- job template: " + (f"`{lineage.job_template}` v{lineage.job_template_version}" if lineage.job_template
                                     else f"none ({lineage.job_template_missing_reason})"),
             f"- environment lockfile sha256 `{lineage.environment_sha256}`",
             f"- chat template sha256: `{lineage.chat_template_sha256 or 'none'}`", "",
             *(vision_card(lineage.vision) if lineage.vision else []),
             f"## Evaluation: {lineage.eval_verdict}", ""]
    lines += [f"- {r}" for r in lineage.eval_reasons] or ["- (no reasons given)"]
    lines += ["", "## Files (sha256)", ""] + [f"- `{f}`: `{h}`" for f, h in lineage.files.items()]
    return "\n".join(lines) + "\n"


def vision_card(v: VisionSettings) -> list[str]:
    """The model card's section on images: what a server needs to feed them as in training."""
    size = v.tower_image_size
    tower = ("frozen (LoRA on the language model only)" if v.vision_tower == "frozen"
             else "adapted (LoRA on the vision tower and projector too)")
    return ["## Vision", "",
            f"- processor: `{v.processor_class}` with image processor `{v.image_processor_class}` (the processor "
            "config files come with the adapter)",
            f"- image size: {f'{size[0]} x {size[1]} pixels' if size else 'as the processor resizes'}"
            + (f"; patch size {v.patch_size}" if v.patch_size else ""),
            f"- image token: `{v.image_token or 'none'}`; tokens per image: "
            f"{v.tokens_per_image if v.tokens_per_image is not None else 'as the processor counts'}",
            f"- vision tower: {tower}",
            f"- packing: {'on' if v.packing else 'off (examples with images are never packed)'}"
            + (f"; images trained: {v.images_trained}" if v.images_trained is not None else ""), ""]
