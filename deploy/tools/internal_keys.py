"""The two keys derived from the platform's internal secret that the other services get instead of it
(issue 35 p5): the identity public key (every service but the gateway and the scheduler verifies the
gateway's signed identities and operators' internal calls with it, and can sign neither) and the file-id
key (ingest mints the Files API's ids with it; the scheduler derives it from the secret).

    WHETSTONE_INTERNAL_SECRET=<the secret> .venv/bin/python deploy/tools/internal_keys.py

prints `identity-public-key=<hex>` and `file-id-key=<hex>`, the two other entries of the
`whetstone-internal` Secret (README: Operations -> Deploy)."""

from __future__ import annotations

import os
import sys

from whetstone.runtime.file_ids import derive_file_id_key
from whetstone.runtime.identity import IdentityKeys


def derived(secret: bytes) -> dict[str, str]:
    return {"identity-public-key": IdentityKeys.from_secret(secret).public_hex(),
            "file-id-key": derive_file_id_key(secret).hex()}


def main() -> int:
    secret = os.environ.get("WHETSTONE_INTERNAL_SECRET", "")
    if not secret:
        print("set WHETSTONE_INTERNAL_SECRET to the platform's internal secret", file=sys.stderr)
        return 2
    for name, value in derived(secret.encode()).items():
        print(f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
