"""Lineage of a model, its model card and the files a user may take away. Pure: no IO."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

# never served: pickles execute code on load
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")


class IncompleteLineage(ValueError):
    pass


@dataclass(frozen=True)
class LineageRecord:
    """Everything that made a model; every field is required (the job template may be missing
    only with a reason, until job templates exist)."""

    job_id: str
    base_model: str
    base_model_sha256: str
    dataset_id: str
    dataset_version: str
    method: str
    hyperparameters: dict[str, Any]
    hyperparameters_hash: str
    training_run: str
    checkpoint_step: int
    job_template: str | None
    job_template_version: str | None
    job_template_missing_reason: str | None
    environment: dict[str, Any]
    environment_sha256: str
    eval_verdict: str
    eval_metrics: list[dict[str, Any]]
    eval_stages: list[dict[str, Any]]
    files: dict[str, str]
    chat_template_sha256: str | None = None
    eval_reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        required = ("job_id", "base_model", "base_model_sha256", "dataset_id", "dataset_version", "method",
                    "hyperparameters_hash", "training_run", "environment_sha256", "eval_verdict")
        missing = [n for n in required if not getattr(self, n)]
        if not self.files:
            missing.append("files")
        if not (self.job_template and self.job_template_version) and not self.job_template_missing_reason:
            missing.append("job_template (or the reason it is missing)")
        if missing:
            raise IncompleteLineage(f"lineage of {self.job_id} lacks {', '.join(missing)}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def file_manifest(manifest: dict[str, Any]) -> dict[str, str]:
    """checkpoint manifest.json -> {relative path: sha256}."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ValueError("manifest lists no files")
    return {rel: str(info["sha256"]) for rel, info in sorted(files.items())}


def pickles(files: dict[str, str]) -> list[str]:
    return [f for f in files if f.lower().endswith(PICKLE_SUFFIXES)]


def chat_template_sha256(template: str | None) -> str | None:
    return hashlib.sha256(template.encode()).hexdigest() if template else None


def chat_template_from(files: dict[str, bytes]) -> str | None:
    """The chat template saved with the tokenizer: chat_template.jinja, else tokenizer_config.json's."""
    if files.get("chat_template.jinja"):
        return files["chat_template.jinja"].decode()
    raw = files.get("tokenizer_config.json")
    if raw:
        value = json.loads(raw).get("chat_template")
        if isinstance(value, str):
            return value
        if isinstance(value, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            return named.get("default")
    return None


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
    """A Hugging Face model card: YAML front matter (base_model, datasets, model-index) + prose."""
    results = []
    for stage in lineage.eval_stages or [{"name": "gate", "status": lineage.eval_verdict, "metrics": lineage.eval_metrics}]:
        metrics = [{"type": m["name"], "name": m["name"], "value": m["candidate"],
                    **({"args": {"base": m["base"]}} if m.get("base") is not None else {})}
                   for m in stage.get("metrics", [])]
        if metrics:
            results.append({"task": {"type": "text-generation", "name": stage["name"]},
                            "dataset": {"type": lineage.dataset_id, "name": lineage.dataset_id,
                                        "revision": lineage.dataset_version},
                            "metrics": metrics})
    front = {
        "base_model": lineage.base_model,
        "base_model_relation": "adapter" if lineage.method in ("lora", "qlora", "dpo", "orpo") else "finetune",
        "library_name": "peft",
        "datasets": [lineage.dataset_id],
        "tags": ["whetstone", lineage.method],
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
             f"## Evaluation: {lineage.eval_verdict}", ""]
    lines += [f"- {r}" for r in lineage.eval_reasons] or ["- (no reasons given)"]
    lines += ["", "## Files (sha256)", ""] + [f"- `{f}`: `{h}`" for f, h in lineage.files.items()]
    return "\n".join(lines) + "\n"
