"""Artifacts a user can take away: the adapter (and merged weights) by presigned URL, each file
checked against its recorded sha256 first. Safetensors and JSON only: never a pickle."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, Field

from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import not_found
from whetstone.runtime.service import Runtime
from whetstone.runtime.weights import full_model_files, holds_full_weights

from ..adapters.artifacts import ArtifactMissing, ArtifactStore
from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain import lineage as lineage_rules
from ..domain.merges import MergeState
from ..domain.stages import ModelRecord

# with the adapter when the artifact has them: the tokenizer and chat template, and for a vision-language
# base the processor (image processor settings, image token) the adapter was trained with
ADAPTER_EXTRAS = ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "processor_config.json", "preprocessor_config.json")


def model_not_found(model_id: str) -> ApiError:
    return not_found(f"The model '{model_id}' does not exist", code="model_not_found", param="model")


async def owned(store: ModelStore, tenant_id: str, model_id: str) -> ModelRecord:
    """The tenant's model; 404 model_not_found otherwise (another tenant's model included)."""
    model = await store.get(model_id, tenant_id)
    if model is None:
        raise model_not_found(model_id)
    return model


def corrupted(model: ModelRecord, what: str) -> ApiError:
    return ApiError(409, f"The artifact of model '{model.model_id}' is corrupted: {what}. Nothing was served; the"
                    " platform operators have to restore it.", code="artifact_corrupted", retry=False)


async def _load(rt: Runtime[RegistryContext], tenant_id: str, model_id: str) -> ModelRecord:
    async with rt.uow() as uow:
        return await owned(ModelStore(uow.conn), tenant_id, model_id)


async def verify(rt: Runtime[RegistryContext], model: ModelRecord, files: dict[str, str]) -> dict[str, int]:
    """Check manifest.json and every file against the recorded sha256 (a file whose ETag was
    verified before is not hashed again). Returns sizes; ApiError artifact_corrupted otherwise."""
    artifacts = rt.ctx.artifacts
    try:
        digest, _ = await asyncio.to_thread(artifacts.read_manifest, model.artifact_uri)
    except ArtifactMissing:
        raise corrupted(model, "manifest.json is missing") from None
    if digest != model.artifact_sha256:
        raise corrupted(model, "manifest.json does not match its recorded sha256")
    sizes: dict[str, int] = {}
    for rel, expected in files.items():
        uri = artifacts.file_uri(model.artifact_uri, rel)
        try:
            info = await asyncio.to_thread(artifacts.info, uri)
        except ArtifactMissing:
            raise corrupted(model, f"{rel} is missing") from None
        async with rt.uow() as uow:
            known = await ModelStore(uow.conn).verified(uri)
        if known != (info.etag, expected):
            actual = await asyncio.to_thread(artifacts.sha256, uri)
            if actual != expected:
                rt.log.error("artifact file does not match its sha256", model_id=model.model_id, file=rel,
                             expected=expected, actual=actual)
                raise corrupted(model, f"{rel} does not match its sha256")
            async with rt.uow() as uow:
                await ModelStore(uow.conn).remember_verified(uri, info.etag, expected)
        sizes[rel] = info.size
    return sizes


@dataclass(frozen=True)
class Links:
    """Where a listed file is fetched from: a presigned object-store URL, or, when the registry's
    `public_base_url` is set (users who cannot reach the object store), the platform's API, which
    streams the file to a caller holding a key that can read the model."""
    artifacts: ArtifactStore
    ttl: int
    api_base: str | None

    @classmethod
    def of(cls, rt: Runtime[RegistryContext]) -> Links:
        cfg = rt.ctx.config
        return cls(rt.ctx.artifacts, cfg.presign_ttl_s, cfg.public_base_url.rstrip("/") if cfg.public_base_url else None)

    def entry(self, uri: str, api_path: str, name: str, sha256: str, size: int) -> FileLink:
        url = (f"{self.api_base}/v1/models/{api_path}/{name}" if self.api_base
               else self.artifacts.presign(uri, self.ttl, name.rsplit("/", 1)[-1]))
        return FileLink(name, url, sha256, size)


@dataclass(frozen=True)
class FileLink:
    """A file of a download listing."""

    name: str
    url: str
    sha256: str
    size: int


def _absent(value: object) -> bool:
    return value is None


class ModelContent(BaseModel):
    """`GET /v1/models/{id}/content`: signed links to a version's files (its adapter, or a full
    fine-tune's weights with their `shards`), each file's sha256, and the training artifact's manifest."""

    id: str
    object: Literal["model.content"] = "model.content"
    format: str = Field(description="peft-lora-safetensors | safetensors-full-weights")
    base_model: str | None
    base_model_sha256: str | None
    shards: list[str] | None = Field(default=None, exclude_if=_absent, description="full weights: the weight files")
    expires_in: int = Field(description="seconds the links stay valid")
    files: list[FileLink]
    manifest: dict[str, str] = Field(description="file name -> sha256 of the files listed")
    training_manifest_sha256: str
    training_manifest: dict[str, str]


class MergedWeights(BaseModel):
    """`GET|POST /v1/models/{id}/merged`: the merge of a version's adapter into its base, and signed links
    to the merged weights once it succeeded."""

    id: str
    object: Literal["model.merge"] = "model.merge"
    model: str
    status: MergeState
    merge_job_id: str | None
    error: str | None
    files: list[FileLink]
    expires_in: int | None = Field(default=None, exclude_if=_absent)


async def adapter_download(rt: Runtime[RegistryContext], tenant_id: str, model_id: str) -> ModelContent:
    model = await _load(rt, tenant_id, model_id)
    files = model.files
    if holds_full_weights(files):   # a full fine-tune or continued pre-training: the weights themselves
        from .full_weights import weights_download

        return await weights_download(rt, model)
    if "adapter_model.safetensors" not in files or "adapter_config.json" not in files:
        unsafe = lineage_rules.pickles(files)
        raise ApiError(409, f"model '{model_id}' has no safetensors adapter to download"
                       + (f" (pickle files are never served: {', '.join(unsafe)})" if unsafe else ""),
                       code="no_adapter_artifact")
    wanted = {rel: files[rel] for rel in ("adapter_model.safetensors", *ADAPTER_EXTRAS) if rel in files}
    wanted["adapter_config.json"] = files["adapter_config.json"]
    sizes = await verify(rt, model, wanted)
    links = Links.of(rt)
    artifacts, ttl, path = links.artifacts, links.ttl, f"{model_id}/files"
    served_config_uri = served_uri(rt, model, "adapter_config.json")
    try:
        served_config = await asyncio.to_thread(artifacts.read, served_config_uri)
    except ArtifactMissing:
        raise corrupted(model, "the served adapter_config.json is missing") from None
    out: list[FileLink] = []
    for rel, sha in wanted.items():
        if rel == "adapter_config.json":
            continue
        out.append(await asyncio.to_thread(links.entry, artifacts.file_uri(model.artifact_uri, rel), path, rel, sha,
                                           sizes[rel]))
    out.insert(1, await asyncio.to_thread(links.entry, served_config_uri, path, "adapter_config.json",
                                          hashlib.sha256(served_config).hexdigest(), len(served_config)))
    card_uri = served_uri(rt, model, "README.md")
    try:
        card = await asyncio.to_thread(artifacts.read, card_uri)
        out.append(await asyncio.to_thread(links.entry, card_uri, path, "README.md", hashlib.sha256(card).hexdigest(),
                                           len(card)))
    except ArtifactMissing:
        pass
    lineage = model.lineage
    return ModelContent(id=model_id, format="peft-lora-safetensors",
                        base_model=lineage.base_model if lineage else None,
                        base_model_sha256=lineage.base_model_sha256 if lineage else None,
                        expires_in=ttl, files=out, manifest={f.name: f.sha256 for f in out},
                        training_manifest_sha256=model.artifact_sha256, training_manifest=dict(wanted))


async def merged_download(rt: Runtime[RegistryContext], tenant_id: str, model_id: str) -> MergedWeights:
    async with rt.uow() as uow:
        store = ModelStore(uow.conn)
        model = await owned(store, tenant_id, model_id)
        merge = await store.merge(model_id)
    if merge is None:
        raise ApiError(404, f"no merged weights requested for model '{model_id}': POST /v1/models/{model_id}/merged",
                       code="merge_not_requested")
    if merge.status != MergeState.SUCCEEDED or merge.uri is None:
        return MergedWeights(id=merge.merge_id, model=model_id, status=merge.status, merge_job_id=merge.merge_job_id,
                             error=merge.error, files=[])
    merged_uri = merge.uri
    files = {rel: sha for rel, sha in merge.files.items() if not rel.lower().endswith(lineage_rules.PICKLE_SUFFIXES)}
    source = model if merged_uri == model.artifact_uri else replace(
        model, artifact_uri=merged_uri, artifact_sha256=merge.manifest_sha256 or "")  # the merge job's own artifact
    sizes = await verify(rt, source, files)
    links = Links.of(rt)
    listed = [await asyncio.to_thread(links.entry, links.artifacts.file_uri(merged_uri, rel), f"{model_id}/merged/files",
                                      rel, sha, sizes[rel]) for rel, sha in files.items()]
    return MergedWeights(id=merge.merge_id, model=model_id, status=merge.status, merge_job_id=merge.merge_job_id,
                         error=merge.error, files=listed, expires_in=links.ttl)


def served_uri(rt: Runtime[RegistryContext], model: ModelRecord, name: str) -> str:
    """The files the registry writes for a version at registration (adapter_config.json naming a base
    PEFT can resolve, the model card), beside the training artifact."""
    return rt.ctx.artifacts.store.uri(f"tenants/{model.tenant_id}/models/{model.model_id}/{name}")


def _file_missing(model_id: str, name: str) -> ApiError:
    return ApiError(404, f"model '{model_id}' has no downloadable file '{name}'", code="file_not_found", param="name")


def _chunks(artifacts: ArtifactStore, uri: str) -> Iterator[bytes]:
    body = artifacts.store.open_stream(uri)
    try:
        yield from iter(lambda: body.read(1 << 20), b"")
    finally:
        body.close()


async def adapter_file(rt: Runtime[RegistryContext], tenant_id: str, model_id: str, name: str) -> Iterator[bytes]:
    """One file of the adapter listing, streamed by the API (downloads through `public_base_url`):
    the same files as the listing, each verified against its recorded sha256 first."""
    model = await _load(rt, tenant_id, model_id)
    if name in ("adapter_config.json", "README.md"):
        uri = served_uri(rt, model, name)
    elif name in model.files and (name in ("adapter_model.safetensors", *ADAPTER_EXTRAS)
                                  or (holds_full_weights(model.files) and name in full_model_files(model.files))):
        await verify(rt, model, {name: model.files[name]})
        uri = rt.ctx.artifacts.file_uri(model.artifact_uri, name)
    else:
        raise _file_missing(model_id, name)
    try:
        await asyncio.to_thread(rt.ctx.artifacts.info, uri)
    except ArtifactMissing:
        raise _file_missing(model_id, name) from None
    return _chunks(rt.ctx.artifacts, uri)


async def merged_file(rt: Runtime[RegistryContext], tenant_id: str, model_id: str, name: str) -> Iterator[bytes]:
    """One file of the merged weights, streamed by the API, verified against its sha256 first."""
    async with rt.uow() as uow:
        store = ModelStore(uow.conn)
        model = await owned(store, tenant_id, model_id)
        merge = await store.merge(model_id)
    if merge is None or merge.status != MergeState.SUCCEEDED or merge.uri is None or name not in merge.files \
            or name.lower().endswith(lineage_rules.PICKLE_SUFFIXES):
        raise _file_missing(model_id, name)
    source = replace(model, artifact_uri=merge.uri, artifact_sha256=merge.manifest_sha256 or "")
    await verify(rt, source, {name: merge.files[name]})
    return _chunks(rt.ctx.artifacts, rt.ctx.artifacts.file_uri(merge.uri, name))
