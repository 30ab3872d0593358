"""Every Grafana panel against a real Prometheus scraping every service of a real workload.

The workload: all six services on the embedded stack, one dataset uploaded (and its upload event
delivered twice: the inbox absorbs the copy), a poison message (dead-lettered), a job request the
scheduler refuses, one LoRA fine-tune on a tiny model through training, eval, registry and metering.
Then each panel's queries run through the Prometheus HTTP API over the workload's time range:
a query error fails, a panel without series fails unless its subject is not exercised by this
workload (`whetstoneIdleInDemo` says why), and a metric no service exports fails in every case.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from whetstone.cli.main import submit_dataset
from whetstone.devstack.job_flow import create_and_follow
from whetstone.contracts import DatasetSubmittedV1
from whetstone.devstack.testing import send, send_event, wait_until
from whetstone.modelkit.tiny import build_tiny_model
from whetstone.runtime.identity import IdentityAuth

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "examples" / "datasets" / "chat_demo.jsonl"
PROMETHEUS = shutil.which("prometheus")
METRIC = re.compile(r"\b(whetstone_[a-z0-9_]+|up)\b(?!\s*[=!~(])")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def panels() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        for p in json.loads(path.read_text())["panels"]:
            out.append((path.name, p))
    return out


def grafana_to_promql(expr: str) -> str:
    """Template variables as Grafana would expand them with 'All' selected."""
    expr = expr.replace("$__rate_interval", "15s").replace("$__interval", "5s")
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr)


def exported_names(texts: list[str]) -> set[str]:
    names: set[str] = set()
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                names.add(name)
                if kind == "counter":
                    names.add(name if name.endswith("_total") else name + "_total")
                if kind == "histogram":
                    names.update({name + "_bucket", name + "_count", name + "_sum"})
            elif line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, 1)[0])
    return names | {"up"}


@pytest.fixture
def prometheus(tmp_path: Path):
    if PROMETHEUS is None:
        pytest.skip("prometheus missing: `apt-get install prometheus` (make test runs "
                    "deploy/tools/ensure-prometheus.sh, which installs it as root)")
    procs: list[subprocess.Popen] = []

    def start(targets: dict[str, int]) -> str:
        port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [{"job_name": f"whetstone-{name}",
                                      "static_configs": [{"targets": [f"127.0.0.1:{p}"]}]}
                                     for name, p in sorted(targets.items())]}
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
             "--query.lookback-delta=30s"], stdout=log, stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture
def whet_dev(settings, tmp_path: Path, monkeypatch):
    """`whet dev` (every service and the gateway in one process) as a subprocess on the test's stack;
    stopped with SIGTERM, killed if it does not stop within 30 s."""
    monkeypatch.setenv("WHETSTONE_METRICS_INTERVAL_S", "1")
    monkeypatch.setenv("WHETSTONE_SERVING_HTTP_PORT", "0")
    build_tiny_model(Path(settings.model_catalog) / "tiny-llama")
    log_path = tmp_path / "whet-dev.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "whetstone.cli", "dev", "--api-port", str(free_port())],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    async def ports() -> dict[str, int]:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith("services: "):
                    return {k: int(v.rsplit(":", 1)[1]) for k, v in (w.split("=", 1) for w in line[10:].split())}
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            await asyncio.sleep(0.5)
        raise AssertionError("whet dev did not start: " + log_path.read_text(errors="replace")[-3000:])

    yield ports
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def check_trace(job_id: str) -> None:
    """`whet jobs trace` on the finished job (services found through the file `whet dev` wrote): its
    events from the topics in production order, each with the services that consumed it, their
    consumer lag and handler latency, none negative."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "whetstone.cli", "jobs", "trace", job_id, "--json",
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    trace = json.loads(out)
    assert not trace["unanswered"], trace["unanswered"]
    events = trace["events"]
    produced = [e["produced_at"] for e in events]
    assert produced == sorted(produced)
    types = [e["event_type"] for e in events]
    for expected in ("job.queued", "job.assigned", "job.started", "job.progress", "checkpoint.written",
                     "job.completed", "eval.completed", "model.registered", "usage.metered"):
        assert expected in types, (expected, types)
    assert types.index("job.queued") < types.index("job.assigned") < types.index("job.completed")
    consumers = {c["service"] for e in events for c in e["consumers"]}
    assert {"scheduler", "trainer-agent", "eval", "registry", "metering"} <= consumers, consumers
    by_type = {e["event_type"]: {c["service"] for c in e["consumers"]} for e in events}
    assert "trainer-agent" in by_type["job.assigned"] and "scheduler" in by_type["job.completed"]
    hops = [c for e in events for c in e["consumers"]]
    assert all(c["lag_s"] >= 0 and c["handler_s"] >= 0 and c["outcome"] == "handled" for c in hops), hops
    unplaced = [{k: e[k] for k in ("event_type", "event_id", "topic", "offset", "producer", "produced_at", "consumers")}
                for e in events if not (e["producer"] and e["offset"] is not None)]
    assert not unplaced, unplaced


async def test_every_dashboard_panel_has_data_from_a_real_workload(settings, whet_dev, prometheus):
    ports = await whet_dev()
    assert {"ingest", "scheduler", "trainer-agent", "eval", "registry", "metering"} <= set(ports)
    prom = prometheus(ports)
    started = time.time()
    async with httpx.AsyncClient(base_url=prom, timeout=10) as api:
        async def ready():
            try:
                reply = await api.get("/api/v1/targets")
            except httpx.HTTPError:
                return False
            if reply.status_code != 200:  # Prometheus answers 503 "Service Unavailable" until it is ready
                return False
            targets = reply.json()["data"]["activeTargets"]
            return len(targets) == len(ports) and all(t["health"] == "up" for t in targets)
        await wait_until(ready, 60, "prometheus scraping every service")

        bootstrap = settings.kafka_bootstrap
        dataset_id = await submit_dataset(settings, DATASET, "demo")
        await send(bootstrap, "dataset.submitted", b"{not json", key="poison")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['scheduler']}", timeout=30) as c:
            r = await c.post("/v1/fine_tuning/jobs", json={"model": "no-such-model", "training_file": "ds-missing"},
                             auth=IdentityAuth("demo"), headers={"Idempotency-Key": "refused-1"})
            assert 400 <= r.status_code < 500, r.text
        body = {"model": "tiny-llama", "training_file": dataset_id, "method": "lora",
                "hyperparameters": {"n_epochs": 1, "learning_rate": 2e-3, "batch_size": 8, "max_seq_len": 256,
                                    "checkpoint_every_steps": 8, "lora_r": 8}}
        result = await create_and_follow(ports, "demo", body, key="ops-1")
        assert result["job"]["status"] == "succeeded", result["job"]
        await check_trace(result["job"]["id"])
        # an upload event delivered twice (same event id): the second copy is absorbed by ingest's inbox
        dup = DatasetSubmittedV1(dataset_id="ds-" + "0" * 24, name="dup", source_uri=f"s3://{settings.bucket}/missing")
        await send_event(bootstrap, dup, "demo", times=2)
        await asyncio.sleep(6)  # a few more scrapes and collector rounds after the last event

        texts = [(await api.get(f"http://127.0.0.1:{port}/metrics")).text for port in ports.values()]
        exported = exported_names(texts)
        end = time.time()
        problems: list[str] = []
        for file, panel in panels():
            has_data = False
            for target in panel["targets"]:
                expr = target["expr"]
                missing = {m for m in METRIC.findall(expr) if m not in exported}
                if missing:
                    problems.append(f"{file} / {panel['title']}: no service exports {sorted(missing)}")
                r = await api.get("/api/v1/query_range", params={
                    "query": grafana_to_promql(expr), "start": started, "end": end, "step": 2})
                data = r.json()
                if data.get("status") != "success":
                    problems.append(f"{file} / {panel['title']}: query error {data.get('error')!r}: {expr}")
                    continue
                has_data = has_data or bool(data["data"]["result"])
            if not has_data and not panel.get("whetstoneIdleInDemo"):
                problems.append(f"{file} / {panel['title']}: no series")
        assert not problems, "\n".join(problems)
