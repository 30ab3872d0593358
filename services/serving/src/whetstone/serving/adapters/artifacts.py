"""Fetch an adapter artifact from S3 by its manifest and verify every byte before it is used.

The manifest (`manifest.json`, written last by the trainer) must hash to the sha256 the registry
recorded; every file taken from it must hash to the manifest's entry. Only what serving needs is
downloaded: the LoRA weights (safetensors only), its config and the chat template of training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import ClientError

from whetstone.runtime.chat_templates import TEMPLATE_FILES, chat_template_from
from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint, read_manifest
from whetstone.runtime.s3 import ObjectStore

from ..domain.catalog import AdapterCorrupted, AdapterUnavailable, ChatTemplateMismatch, ModelVersion

_MISSING = ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


def _read_error(what: str, exc: Exception) -> Exception:
    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in _MISSING:
        return AdapterCorrupted(f"{what} is missing from the object store.")
    return AdapterUnavailable(f"{what} could not be read from the object store ({type(exc).__name__}); retry.")

MANIFEST = "manifest.json"
REQUIRED = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class FetchedAdapter:
    directory: Path
    chat_template: str | None  # None: the artifact carries none, the base tokenizer's applies


def template_from(directory: Path, present: set[str]) -> str | None:
    """The chat template saved with the training tokenizer (see runtime.chat_templates)."""
    return chat_template_from({name: (directory / name).read_bytes() for name in TEMPLATE_FILES if name in present})


def fetch_adapter(store: ObjectStore, version: ModelVersion, dest: Path, base_template: str | None) -> FetchedAdapter:
    """Download + verify; AdapterCorrupted / ChatTemplateMismatch on any doubt. Blocking: run in a thread."""
    uri = (version.artifact_uri or "").rstrip("/")
    try:
        manifest, _ = read_manifest(store, uri, version.artifact_sha256)
    except (CorruptCheckpoint, ValueError) as exc:  # ValueError: not an s3:// uri
        raise AdapterCorrupted(f"The artifact of `{version.name}` cannot be trusted: {exc}") from exc
    except Exception as exc:
        raise _read_error(f"The manifest of `{version.name}`", exc) from exc
    files = manifest.sha256s()
    for rel, sha in version.files.items():
        if rel in files and files[rel] != sha:
            raise AdapterCorrupted(f"{rel} of `{version.name}`: the manifest disagrees with the registry's sha256.")
    missing = [f for f in REQUIRED if f not in files]
    if missing:
        raise AdapterCorrupted(f"The artifact of `{version.name}` lacks {', '.join(missing)} "
                               "(safetensors only; pickled weights are never loaded).")
    wanted = [*REQUIRED, *(f for f in TEMPLATE_FILES if f in files)]
    dest.mkdir(parents=True, exist_ok=True)
    try:
        download_checkpoint(store, uri, dest, only=wanted, manifest=manifest)
    except CorruptCheckpoint as exc:
        raise AdapterCorrupted(f"The adapter `{version.name}` does not match its sha256 in the manifest: {exc}") from exc
    except Exception as exc:
        raise _read_error(f"The files of `{version.name}`", exc) from exc
    template = template_from(dest, set(wanted))
    if version.chat_template_sha256:
        used = template or base_template
        if not used or hashlib.sha256(used.encode()).hexdigest() != version.chat_template_sha256:
            raise ChatTemplateMismatch(f"The chat template available for `{version.name}` is not the one it was "
                                       "trained with (sha256 differs); refusing to serve it with another.")
    return FetchedAdapter(dest, template)
