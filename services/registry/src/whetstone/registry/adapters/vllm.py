"""Handoff to production servers: keep a vLLM fleet in step with the registry, lay adapters out
for vLLM's filesystem resolver, and name the S3 adapter source LoRAX expects.

vLLM runtime LoRA endpoints (server started with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`):
  POST /v1/load_lora_adapter   {"lora_name", "lora_path"}  -> 200 "Success: LoRA adapter ... added successfully."
  POST /v1/unload_lora_adapter {"lora_name"}               -> 200 "Success: LoRA adapter ... removed successfully."
  GET  /v1/models: loaded adapters are the entries with a `parent` (the base), `root` = their path.
Errors are JSON (`{"object": "error", "message", "type", "code"}`, or nested under "error" in newer
versions): loading a name twice is a 400 "... has already been loaded", unloading an unknown one
a 400/404 "... cannot be found". Both are treated as done, so a sync is idempotent.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from ..domain.lineage import VisionSettings, served_adapter_config
from ..domain.vllm_serve import PROCESSOR_FILES, SERVE_FILE, TEMPLATE_FILE, VllmServeFull, vllm_serve


class VllmError(Exception):
    pass


@dataclass
class SyncReport:
    loaded: list[tuple[str, str]] = field(default_factory=list)    # (server, lora name)
    unloaded: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _ErrorDetail(BaseModel):
    message: str


class _ErrorBody(BaseModel):
    """vLLM's error JSON: the message at the top level, or nested under `error` in newer versions."""

    message: str | None = None
    error: _ErrorDetail | None = None


class _ServedModel(BaseModel):
    id: str
    root: str | None = None
    parent: str | None = None   # set on a LoRA adapter: the base it runs on


class _ModelList(BaseModel):
    data: list[_ServedModel] = []


def _message(r: httpx.Response) -> str:
    try:
        body = _ErrorBody.model_validate_json(r.content)
    except ValidationError:
        return r.text
    if body.error is not None:
        return body.error.message
    return body.message if body.message is not None else r.text


class VllmFleet:
    """The vLLM servers serving one base model."""

    def __init__(self, urls: list[str], *, api_key: str | None = None, client: httpx.AsyncClient | None = None,
                 timeout_s: float = 60.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.AsyncClient(timeout=timeout_s, headers=headers)

    async def close(self) -> None:
        await self.client.aclose()

    async def loaded(self, url: str) -> dict[str, str]:
        """lora name -> path of every adapter the server has loaded."""
        r = await self.client.get(f"{url}/v1/models")
        if r.status_code != 200:
            raise VllmError(f"{url}: GET /v1/models -> {r.status_code} {_message(r)}")
        listed = _ModelList.model_validate_json(r.content)
        return {m.id: m.root or "" for m in listed.data if m.parent}

    async def load(self, url: str, name: str, path: str) -> bool:
        """True when loaded now, False when it already was."""
        r = await self.client.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        if r.status_code == 200:
            return True
        message = _message(r)
        if r.status_code == 400 and "already been loaded" in message:
            return False
        raise VllmError(f"{url}: load {name} from {path} -> {r.status_code} {message}")

    async def unload(self, url: str, name: str) -> bool:
        r = await self.client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})
        if r.status_code == 200:
            return True
        message = _message(r)
        if r.status_code in (400, 404) and "cannot be found" in message:
            return False
        raise VllmError(f"{url}: unload {name} -> {r.status_code} {message}")

    async def swap(self, url: str, name: str, path: str) -> None:
        """Serve another version under the same name (promotion, rollback): unload + load."""
        await self.unload(url, name)
        await self.load(url, name, path)

    async def sync(self, desired: Mapping[str, str]) -> SyncReport:
        """Make every server serve exactly `desired` (lora name -> path). A server that fails is
        reported and retried at the next sync; the others still move."""
        report = SyncReport()
        for url in self.urls:
            try:
                current = await self.loaded(url)
                for name in sorted(set(current) - set(desired)):
                    if await self.unload(url, name):
                        report.unloaded.append((url, name))
                for name, path in sorted(desired.items()):
                    if name not in current:
                        await self.load(url, name, path)
                        report.loaded.append((url, name))
                    elif current[name] != path:
                        await self.swap(url, name, path)
                        report.unloaded.append((url, name))
                        report.loaded.append((url, name))
            except (VllmError, httpx.HTTPError) as exc:
                report.errors.append(f"{url}: {exc}")
        return report


def lay_out_for_resolver(root: Path, lora_name: str, adapter_dir: Path, served_base: str,
                         vision: VisionSettings | None = None) -> Path:
    """`<root>/<lora_name>/` as vLLM's filesystem resolver loads it (VLLM_PLUGINS=lora_filesystem_resolver,
    VLLM_LORA_RESOLVER_CACHE_DIR=<root>): the safetensors weights and an adapter_config.json with
    `peft_type: LORA` and `base_model_name_or_path` = the served base, and whetstone_vllm.json naming the
    `vllm serve` settings the adapter needs (`domain.vllm_serve`: for a vision adapter the multimodal
    ones, with its chat template and processor config files beside it). Replaced atomically."""
    if "/" in lora_name or lora_name in ("", ".", ".."):
        raise ValueError(f"invalid lora name {lora_name!r}")
    weights = adapter_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{adapter_dir} has no adapter_model.safetensors (pickles are never laid out)")
    config: dict[str, Any] = json.loads((adapter_dir / "adapter_config.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{lora_name}.", dir=root))
    shutil.copyfile(weights, staging / "adapter_model.safetensors")
    (staging / "adapter_config.json").write_text(json.dumps(served_adapter_config(config, served_base), indent=2))
    target = root / lora_name
    extras = [name for name in (TEMPLATE_FILE, *PROCESSOR_FILES) if vision and (adapter_dir / name).is_file()]
    for name in extras:
        shutil.copyfile(adapter_dir / name, staging / name)
    template = str(target / TEMPLATE_FILE) if TEMPLATE_FILE in extras else None
    serve = vllm_serve(served_base, config, vision, chat_template=template)
    (staging / SERVE_FILE).write_text(json.dumps(serve.document(), indent=2))
    return _swap_in(staging, target)


def lay_out_full_model(root: Path, name: str, model_dir: Path, served_name: str, base_model: str) -> Path:
    """`<root>/<name>/`: a full-weight model's safetensors shards, config and tokenizer as `vllm serve <dir>`
    loads them, with whetstone_vllm.json naming that command (`domain.vllm_serve.VllmServeFull`).
    Replaced atomically."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"invalid model directory name {name!r}")
    if not any(p.name.endswith(".safetensors") for p in model_dir.iterdir()):
        raise ValueError(f"{model_dir} holds no safetensors weights (pickles are never laid out)")
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    for f in model_dir.iterdir():
        if f.is_file():
            shutil.copyfile(f, staging / f.name)
    target = root / name
    serve = VllmServeFull(model_dir=str(target), served_model_name=served_name, base_model=base_model)
    (staging / SERVE_FILE).write_text(json.dumps(serve.document(), indent=2))
    return _swap_in(staging, target)


def _swap_in(staging: Path, target: Path) -> Path:
    """Puts the finished `staging` directory at `target`, replacing what was there by renames only."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def lorax_adapter(artifact_uri: str) -> dict[str, str]:
    """The `parameters` LoRAX needs to serve an adapter straight from S3."""
    if not artifact_uri.startswith("s3://"):
        raise ValueError(f"LoRAX's s3 source needs an s3:// uri, got {artifact_uri!r}")
    return {"adapter_id": artifact_uri.rstrip("/"), "adapter_source": "s3"}
