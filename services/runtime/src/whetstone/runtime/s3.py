"""Object store over boto3 (SeaweedFS embedded, any S3 in production).

Keys are always under a tenant prefix: ``tenants/<tenant_id>/...``."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def is_missing(exc: BaseException) -> bool:
    """The store's answer for an object (or bucket) that does not exist."""
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def parse_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// uri: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket or not key:
        raise ValueError(f"s3 uri needs a bucket and a key: {uri!r}")
    return bucket, key


def tenant_prefix(tenant_id: str) -> str:
    if not _TENANT_RE.match(tenant_id):
        raise ValueError(f"invalid tenant id {tenant_id!r}")
    return f"tenants/{tenant_id}/"


def within_tenant(uri: str, tenant_id: str, bucket: str | None = None) -> bool:
    """Whether the s3:// `uri` lies under `tenant_id`'s prefix (of `bucket`, when given)."""
    try:
        b, key = parse_uri(uri)
        return (bucket is None or b == bucket) and key.startswith(tenant_prefix(tenant_id)) and ".." not in key
    except ValueError:
        return False


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ObjectStore:
    def __init__(self, endpoint: str | None, access_key: str, secret_key: str, bucket: str,
                 region: str = "us-east-1") -> None:
        self.bucket = bucket
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            region_name=region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"},
                          connect_timeout=5, read_timeout=60),
        )

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)
        return self.uri(key)

    def put_file(self, key: str, path: Path) -> str:
        self.client.upload_file(str(path), self.bucket, key)
        return self.uri(key)

    def get_bytes(self, uri: str) -> bytes:
        bucket, key = parse_uri(uri)
        data: bytes = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data

    def open_stream(self, uri: str) -> StreamingBody:
        """A file-like streaming body: read it in chunks, never whole."""
        bucket, key = parse_uri(uri)
        return self.client.get_object(Bucket=bucket, Key=key)["Body"]

    def open_sized(self, uri: str) -> tuple[StreamingBody, int]:
        """`open_stream`'s body with the length of that same object version (the object may be rewritten
        after its size was recorded elsewhere: this is the length the body really has)."""
        bucket, key = parse_uri(uri)
        answer = self.client.get_object(Bucket=bucket, Key=key)
        return answer["Body"], int(answer["ContentLength"])

    def size(self, uri: str) -> int | None:
        bucket, key = parse_uri(uri)
        try:
            return int(self.client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if is_missing(exc):
                return None
            raise

    def exists(self, uri: str) -> bool:
        return self.size(uri) is not None

    def download_file(self, uri: str, dest: Path) -> Path:
        bucket, key = parse_uri(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(bucket, key, str(dest))
        return dest

    def delete(self, uri: str) -> None:
        """Delete one object (deleting one that does not exist is not an error)."""
        bucket, key = parse_uri(uri)
        self.client.delete_object(Bucket=bucket, Key=key)

    def list_keys(self, prefix: str) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def download_prefix(self, uri: str, dest: Path) -> Path:
        bucket, prefix = parse_uri(uri)
        prefix = prefix.rstrip("/") + "/"
        for key in self.list_keys(prefix):
            self.download_file(f"s3://{bucket}/{key}", dest / key[len(prefix):])
        return dest
