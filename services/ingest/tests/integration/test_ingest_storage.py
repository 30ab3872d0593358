"""Storage a tenant cannot lift (issue 35 point 7), through the Files API with the official client:
a per-tenant storage quota (bytes of the files it keeps; an upload past it is 413
storage_quota_exceeded naming the quota, and deleting a file frees its bytes), and uploads that
follow the disk ingest really has (507 insufficient_storage, naming what is free, before a byte is
written).

Ingest runs here as it is deployed, without the platform's internal secret (issue 35 p5): it verifies
the gateway's signed identities with the public key alone (WHETSTONE_IDENTITY_PUBLIC_KEY) and mints
file ids with the file-id key alone (WHETSTONE_FILE_ID_KEY); the test signs as the gateway does, with
a secret ingest never sees, and the ids it got verify for the scheduler (which derives the same key)."""

from __future__ import annotations

import json
import shutil
import uuid

import httpx
import openai
import pytest

from whetstone.ingest.bootstrap import build_service
from whetstone.runtime.file_ids import derive_file_id_key, minted_for
from whetstone.runtime.identity import IdentityAuth, IdentityKeys

pytestmark = pytest.mark.integration
QUOTA = 3_000
GATEWAY_SECRET = b"held by the gateway and the scheduler only"


def rows(tag: str, size: int = 1_200) -> bytes:
    """A JSONL file of exactly `size` bytes, its content unique to `tag`."""
    line = json.dumps({"messages": [{"role": "user", "content": f"{tag} question"},
                                    {"role": "assistant", "content": f"{tag} answer"}]}).encode() + b"\n"
    body = line * (size // len(line))
    return body + b" " * (size - len(body) - 1) + b"\n"


def client(url: str, tenant: str, secret: bytes = GATEWAY_SECRET) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                              http_client=httpx.AsyncClient(auth=IdentityAuth(tenant, secret=secret),
                                                            timeout=60))


async def test_storage_quota_per_tenant_and_the_disk_ingest_really_has(platform, monkeypatch, tmp_path):
    tenant, other = f"quota-{uuid.uuid4().hex[:8]}", f"free-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "ingest-work"
    work.mkdir()
    monkeypatch.setenv("WHETSTONE_INGEST_TENANT_STORAGE_QUOTA_BYTES", json.dumps({tenant: QUOTA}))
    monkeypatch.setenv("WHETSTONE_INGEST_WORK_DIR", str(work))
    monkeypatch.delenv("WHETSTONE_INTERNAL_SECRET", raising=False)
    monkeypatch.setenv("WHETSTONE_IDENTITY_PUBLIC_KEY", IdentityKeys.from_secret(GATEWAY_SECRET).public_hex())
    monkeypatch.setenv("WHETSTONE_FILE_ID_KEY", derive_file_id_key(GATEWAY_SECRET).hex())
    async with platform(build_service) as p:
        url, config = p.url("ingest"), p["ingest"].ctx.config
        mine, theirs = client(url, tenant), client(url, other)
        first = await mine.files.create(file=("a.jsonl", rows("a")), purpose="fine-tune")
        assert minted_for(first.id, tenant, derive_file_id_key(GATEWAY_SECRET))
        with pytest.raises(openai.AuthenticationError):   # signed with anything but the gateway's key
            await client(url, tenant, secret=b"not the gateway's").files.list()
        await mine.files.create(file=("b.jsonl", rows("b")), purpose="fine-tune")   # 2,400 of 3,000 bytes kept
        with pytest.raises(openai.APIStatusError) as over:
            await mine.files.create(file=("c.jsonl", rows("c")), purpose="fine-tune")
        assert over.value.status_code == 413, over.value.response.text
        error = over.value.response.json()["error"]
        assert error["code"] == "storage_quota_exceeded" and error["param"] == "file"
        assert f"storage quota of {QUOTA} bytes" in error["message"] and "2400 bytes" in error["message"]
        assert [f.filename for f in (await mine.files.list()).data] == ["b.jsonl", "a.jsonl"]   # nothing kept of c
        # the quota is the tenant's: another tenant (no quota set) uploads the same size
        await theirs.files.create(file=("c.jsonl", rows("c")), purpose="fine-tune")
        # deleting a file frees its bytes
        assert (await mine.files.delete(first.id)).deleted
        again = await mine.files.create(file=("c.jsonl", rows("c")), purpose="fine-tune")
        assert again.bytes == 1_200

        # the disk: a reserve larger than the free space leaves no room; refused before anything is written
        free = shutil.disk_usage(work).free
        config.disk_reserve_bytes = free + 2**40
        with pytest.raises(openai.APIStatusError) as full:
            await theirs.files.create(file=("d.jsonl", rows("d")), purpose="fine-tune")
        assert full.value.status_code == 507, full.value.response.text
        error = full.value.response.json()["error"]
        assert error["code"] == "insufficient_storage" and "bytes free" in error["message"]
        assert f"{free + 2**40} are kept in reserve" in error["message"]
        assert not [d for d in work.iterdir() if d.name.startswith("upload-")]   # no upload left on the disk
        # the operator frees the disk (here: drops the reserve): the same upload goes through
        config.disk_reserve_bytes = 0
        small = await theirs.files.create(file=("d.jsonl", rows("d")), purpose="fine-tune")
        assert small.bytes == 1_200
        assert sorted(f.filename for f in (await theirs.files.list()).data) == ["c.jsonl", "d.jsonl"]
    assert not (p.settings.data_dir / "internal.secret").exists()   # ingest never read (or made) the secret
