"""Model artifacts in the object store: manifests, small files, verification, presigned URLs.

Blocking (boto3): callers run these methods with `asyncio.to_thread`, outside transactions."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import ClientError

from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint
from whetstone.runtime.s3 import ObjectStore, parse_uri

MANIFEST = "manifest.json"


class ArtifactMissing(Exception):
    pass


class CorruptArtifact(Exception):
    pass


@dataclass(frozen=True)
class ObjectInfo:
    etag: str
    size: int


class ArtifactStore:
    """Bound to the runtime's object store when the service starts (see bootstrap.py)."""

    def __init__(self, store: ObjectStore | None = None) -> None:
        self._store = store

    def bind(self, store: ObjectStore) -> None:
        self._store = store

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            raise RuntimeError("artifact store used before the service started")
        return self._store

    @staticmethod
    def file_uri(prefix_uri: str, rel: str) -> str:
        return prefix_uri.rstrip("/") + "/" + rel

    def read(self, uri: str) -> bytes:
        try:
            return self.store.get_bytes(uri)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise ArtifactMissing(f"{uri} does not exist") from exc
            raise

    def read_manifest(self, prefix_uri: str) -> tuple[str, bytes]:
        """(sha256 of manifest.json, its bytes: `lineage.file_manifest` reads them)."""
        raw = self.read(self.file_uri(prefix_uri, MANIFEST))
        return hashlib.sha256(raw).hexdigest(), raw

    def read_optional(self, prefix_uri: str, rels: tuple[str, ...]) -> dict[str, bytes]:
        out = {}
        for rel in rels:
            try:
                out[rel] = self.read(self.file_uri(prefix_uri, rel))
            except ArtifactMissing:
                pass
        return out

    def write(self, uri: str, data: bytes, content_type: str) -> str:
        bucket, key = parse_uri(uri)
        self.store.client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        return uri

    def info(self, uri: str) -> ObjectInfo:
        bucket, key = parse_uri(uri)
        try:
            head = self.store.client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            raise ArtifactMissing(f"{uri} does not exist") from exc
        return ObjectInfo(head["ETag"].strip('"'), int(head["ContentLength"]))

    def sha256(self, uri: str) -> str:
        """Streamed: an adapter is hashed in 1 MiB blocks, never held whole."""
        body = self.store.open_stream(uri)
        digest = hashlib.sha256()
        try:
            for block in iter(lambda: body.read(1 << 20), b""):
                digest.update(block)
        finally:
            body.close()
        return digest.hexdigest()

    def fetch_verified(self, prefix_uri: str, manifest_sha256: str, rels: tuple[str, ...], dest: Path) -> Path:
        """Download only `rels` of an artifact into `dest`, each checked against the manifest, which is
        checked against its recorded sha256 (a merged model next to the adapter is not fetched)."""
        try:
            download_checkpoint(self.store, prefix_uri, dest, manifest_sha256, only=rels)
        except CorruptCheckpoint as exc:
            raise CorruptArtifact(str(exc)) from exc
        return dest

    def presign(self, uri: str, ttl_s: int, filename: str) -> str:
        bucket, key = parse_uri(uri)
        # no response-header overrides: not every S3 (SeaweedFS) signs them the way boto3 does
        return self.store.client.generate_presigned_url("get_object", ExpiresIn=ttl_s,
                                                        Params={"Bucket": bucket, "Key": key})
