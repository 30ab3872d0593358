"""`whet stack up`: the embedded stack in the foreground until SIGINT/SIGTERM, its endpoints in an
env file a shell can source."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

from .processes import StackStartError
from .stack import EmbeddedStack, StackEndpoints


def write_env_file(env_file: Path, endpoints: StackEndpoints) -> None:
    """Write KEY=VALUE lines a shell can source, atomically."""
    lines = [f"{key}={shlex.quote(value)}\n" for key, value in endpoints.as_env().items()]
    env_file.parent.mkdir(parents=True, exist_ok=True)
    partial = env_file.with_name(env_file.name + ".partial")
    partial.write_text("".join(lines))
    partial.replace(env_file)


def stack_up_main(
    data_dir: Path,
    topics: Sequence[tuple[str, int]],
    buckets: Sequence[str],
    env_file: Path,
    broker_storage: str = "s3",
    **external: str | None,
) -> int:
    """`whet stack up`: run the stack until SIGINT/SIGTERM, publishing its endpoints in `env_file`.
    ``external`` (kafka_bootstrap / database_url / s3_endpoint) replaces that part by a running server.
    The broker is durable by default (its log in S3); "memory" is the explicit fast option."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = EmbeddedStack(data_dir, topics=topics, buckets=buckets, broker_storage=broker_storage, **external)
    exit_code = 0
    try:
        endpoints = stack.start()
        write_env_file(env_file, endpoints)
        for key, value in endpoints.as_env().items():
            print(f"{key}={value}")
        print(f"endpoints written to {env_file} (source it); Ctrl-C to stop", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("stopping the stack", flush=True)
    except StackStartError as exc:
        print(f"the stack failed to start: {exc}", flush=True)
        exit_code = 1
    finally:
        for sig in previous:  # a second Ctrl-C must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        try:
            stack.stop()
            env_file.unlink(missing_ok=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return exit_code
