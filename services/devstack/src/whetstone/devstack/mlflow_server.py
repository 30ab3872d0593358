"""A real MLflow tracking server for tests, run from its own virtualenv (`.venv-mlflow`, made by
deploy/tools/ensure-mlflow.sh: MLflow 3 does not resolve against the platform's constraints). It stores
runs in SQLite and proxies artifacts (`--artifacts-destination`), as an operator's server would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from .processes import _free_ports

REPO = Path(__file__).resolve().parents[5]
START_TIMEOUT_S = 180.0   # the first start of a fresh venv compiles MLflow's modules and migrates SQLite


def mlflow_executable() -> Path | None:
    """The `mlflow` of `.venv-mlflow` (or $MLFLOW_VENV); None where it is not installed."""
    exe = Path(os.environ.get("MLFLOW_VENV", REPO / ".venv-mlflow")) / "bin" / "mlflow"
    return exe if exe.is_file() else None


@dataclass
class MlflowProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    async def ready(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """The base URL once /health answers (the server exiting or not answering in time fails)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mlflow server exited ({self.proc.returncode}): "
                                       f"{self.log_path.read_text()[-2000:]}")
                try:
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server not up within {timeout_s:.0f} s")
                await asyncio.sleep(0.5)


@asynccontextmanager
async def mlflow_server(workdir: Path, exe: Path, port: int | None = None) -> AsyncIterator[MlflowProcess]:
    """`mlflow server` starting on a free 127.0.0.1 port (or `port`), its data under `workdir`; yields at once (its URL is
    known: a platform can start beside it, its tracker retrying until the server answers; `ready()` waits
    for it), and stops it on exit. `port`: a port chosen before (a platform was told the URL already)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or _free_ports(1)[0]
    log_path = workdir / "mlflow-server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(exe), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
         "--artifacts-destination", str(workdir / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir,
        # no job runner (its eight huey worker processes): tracking needs none
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        yield MlflowProcess(f"http://127.0.0.1:{port}", proc, log_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):   # whatever of its process group outlived it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def free_port() -> int:
    """A port for a server to start on later (a test tells the platform its URL first)."""
    return _free_ports(1)[0]
