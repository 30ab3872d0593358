"""`whet stack up` + each service as its own process (`python -m whetstone.<svc>`) + `whet dev` (with the gateway)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

pytestmark = pytest.mark.integration
WHET = str(Path(sys.executable).with_name("whet"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"no healthy service on {port}")


def descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def whet_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHETSTONE_")}
    env["WHETSTONE_DATA_DIR"] = str(tmp_path)
    return env


def test_stack_up_then_services_alone_and_together(tmp_path, whet_env):
    stack = subprocess.Popen([WHET, "stack", "up"], env=whet_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    env_file = tmp_path / "stack.env"
    try:
        deadline = time.monotonic() + 60
        while not env_file.exists():
            assert stack.poll() is None and time.monotonic() < deadline, "stack did not come up"
            time.sleep(0.2)
        servers = descendants(stack.pid)
        assert len(servers) >= 3

        # one service alone, finding the stack through stack.env
        port = free_port()
        reg = subprocess.Popen([sys.executable, "-m", "whetstone.registry"],
                               env={**whet_env, "WHETSTONE_REGISTRY_HTTP_PORT": str(port)})
        health = wait_healthy(port, reg)
        assert health["checks"] == {"postgres": "ok", "kafka": "ok"}
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert "whetstone_service_up" in metrics
        reg.send_signal(signal.SIGTERM)
        assert reg.wait(30) == 0

        # all six in one process
        ports = {svc: free_port() for svc in ("INGEST", "SCHEDULER", "TRAINER_AGENT", "EVAL", "REGISTRY", "METERING")}
        api_port = free_port()  # and the public gateway in front of them, on one port
        dev = subprocess.Popen([WHET, "dev"], env={**whet_env, "WHETSTONE_API_PORT": str(api_port),
                                                   **{f"WHETSTONE_{k}_HTTP_PORT": str(v) for k, v in ports.items()}})
        for p in ports.values():
            wait_healthy(p, dev)
        gateway = wait_healthy(api_port, dev)
        assert gateway["service"] == "gateway" and gateway["upstreams"]["scheduler"] == "ok"
        r = httpx.get(f"http://127.0.0.1:{api_port}/v1/fine_tuning/jobs", headers={"X-Tenant-Id": "demo"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        dev.send_signal(signal.SIGINT)
        assert dev.wait(60) == 0
    finally:
        stack.send_signal(signal.SIGINT)
        out, _ = stack.communicate(timeout=60)
    assert stack.returncode == 0, out
    assert not env_file.exists()
    deadline = time.monotonic() + 15
    while alive(servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(servers) == [], "orphan server processes survived the launcher"
