"""File ids: each upload to the Files API gets its own id, like OpenAI's, `file-<random><mac>`
where the mac is HMAC-SHA256(file-id key, "file-id:v1:<tenant>:<random>") cut to 24 hex digits. The
file-id key is derived from the internal secret (`file_id_key`): the scheduler derives it, ingest is
given only it (`WHETSTONE_FILE_ID_KEY`, hex), which mints and checks file ids and nothing else (no
identity, internal call or producer token). Only the platform can mint one, and an id minted for one
tenant does not verify for another: the scheduler tells an upload whose `dataset.submitted` it has not heard of yet (it waits) from an id that no upload of
this tenant ever had, another tenant's included (it answers 400 at once), without asking ingest."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from .identity import internal_secret, sign

FILE_ID_PREFIX = "file-"
_FILE_ID = re.compile(r"file-([0-9a-f]{16})([0-9a-f]{24})")


FILE_ID_KEY_ENV = "WHETSTONE_FILE_ID_KEY"


def derive_file_id_key(secret: bytes) -> bytes:
    return hmac.new(secret, b"whetstone-file-id-key:v1", hashlib.sha256).digest()


def file_id_key(data_dir: Path | None = None) -> bytes:
    """`WHETSTONE_FILE_ID_KEY` when set (ingest, deployed without the internal secret), else the key
    derived from the internal secret (the scheduler; the dev stack)."""
    given = os.environ.get(FILE_ID_KEY_ENV, "").strip()
    if given:
        try:
            return bytes.fromhex(given)
        except ValueError as exc:
            raise ValueError(f"{FILE_ID_KEY_ENV} is not hex: {exc}") from exc
    return derive_file_id_key(internal_secret(data_dir))


def _mac(tenant_id: str, nonce: str, secret: bytes) -> str:
    return sign(f"file-id:v1:{tenant_id}:{nonce}", secret)[:24]


def mint_file_id(tenant_id: str, secret: bytes) -> str:
    """A new file id for one upload of `tenant_id` (`secret`: the file-id key)."""
    nonce = secrets.token_hex(8)
    return f"{FILE_ID_PREFIX}{nonce}{_mac(tenant_id, nonce, secret)}"


def minted_for(file_id: str, tenant_id: str, secret: bytes) -> bool:
    """Whether the platform minted this file id for this tenant's upload."""
    m = _FILE_ID.fullmatch(file_id)
    return m is not None and hmac.compare_digest(_mac(tenant_id, m.group(1), secret), m.group(2))
