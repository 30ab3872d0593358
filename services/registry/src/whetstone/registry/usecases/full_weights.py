"""Downloads of a full-weight model (a full fine-tune or continued pre-training): every safetensors
shard, its index, config, generation settings, tokenizer and chat template, each by its own presigned
URL (or API URL), each checked against the manifest's sha256 first; the model card beside them."""

from __future__ import annotations

import asyncio
import hashlib

from whetstone.runtime.service import Runtime
from whetstone.runtime.weights import full_model_files, weight_shards

from ..adapters.artifacts import ArtifactMissing
from ..context import RegistryContext
from ..domain.stages import ModelRecord
from .downloads import FileLink, Links, ModelContent, served_uri, verify

FORMAT = "safetensors-full-weights"


def downloadable(model: ModelRecord) -> list[str]:
    """The files of the full model a user takes away (never a pickle, never optimizer state)."""
    return full_model_files(model.files)


async def weights_download(rt: Runtime[RegistryContext], model: ModelRecord) -> ModelContent:
    wanted = {rel: model.files[rel] for rel in downloadable(model)}
    sizes = await verify(rt, model, wanted)
    links = Links.of(rt)
    path = f"{model.model_id}/files"
    out: list[FileLink] = [await asyncio.to_thread(links.entry, links.artifacts.file_uri(model.artifact_uri, rel),
                                                   path, rel, sha, sizes[rel]) for rel, sha in wanted.items()]
    card_uri = served_uri(rt, model, "README.md")
    try:
        card = await asyncio.to_thread(links.artifacts.read, card_uri)
        out.append(await asyncio.to_thread(links.entry, card_uri, path, "README.md", hashlib.sha256(card).hexdigest(),
                                           len(card)))
    except ArtifactMissing:
        pass
    lineage = model.lineage
    return ModelContent(id=model.model_id, format=FORMAT, base_model=lineage.base_model if lineage else None,
                        base_model_sha256=lineage.base_model_sha256 if lineage else None,
                        shards=weight_shards(wanted), expires_in=links.ttl, files=out,
                        manifest={f.name: f.sha256 for f in out}, training_manifest_sha256=model.artifact_sha256,
                        training_manifest=dict(wanted))
