"""Abuse benchmark: two tenants on the embedded stack, the scheduler and the gateway in
processes of their own (as bench/api.py). Tenant A submits jobs and reads them, alone (quiet)
and while tenant B runs every abuse (abused), in alternating windows: event streams held open, 50 requests/s,
a 200 MB JSON body, a chunked body without end, a YAML alias bomb, webhooks for loopback / private /
link-local / decimal and hex addresses, base models named by a path, python-looking text in every
string field. Traffic from this machine goes only to loopback: the webhook addresses that are not
loopback are refused at registration, and any that a broken build accepted is deleted at once.

    .venv/bin/python bench/abuse.py [--seconds 20] [--rounds 2] [--streams 500] [--rate 50]

Last line, one JSON object: quiet_p99_ms and abused_p99_ms (A's create and get, same run), abuses
(each with its answer codes), secrets_leaked (secrets found in any answer B got),
private_addresses_reached (connections a loopback listener named in B's webhooks received, plus
webhooks to a non-public address that were stored), service_restarts."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import SERVE_SCHEDULER, call, free_port, pct, stop_processes, wait_healthy  # noqa: E402

A, B = "ta", "tb"
PYTHONISH = "__import__('os').system('touch {marker}') or {{{{7*7}}}} !!python/object/apply:os.system"


def yaml_bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "name: bomb\nmodel: tiny-llama\neval_config:\n" + "\n".join("  " + x for x in lines) + "\n"


class Listener:
    """A loopback TCP listener named in B's webhook URLs: every connection it gets is a private address reached."""

    def __init__(self) -> None:
        self.connections = 0

    async def start(self) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()
        self.servers = [await asyncio.start_server(handle, "127.0.0.1", 0)]
        port = self.servers[0].sockets[0].getsockname()[1]
        try:
            self.servers.append(await asyncio.start_server(handle, "::1", port))
        except OSError:
            pass
        return port


async def raw_status(port: int, head: str, body_bytes: int = 0) -> str:
    """Send headers (and up to `body_bytes` of body) on a raw socket; the status code, or what happened."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        sent = 0
        while sent < body_bytes:
            writer.write(b" " * 65536)
            sent += 65536
            await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 15)
        return line.split()[1].decode() if len(line.split()) > 1 else "closed"
    except (ConnectionError, asyncio.TimeoutError) as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def tenant_a(s: aiohttp.ClientSession, key: str, seconds: float, body: dict) -> list[float]:
    """A's steady work: create a job, read it, again, for `seconds`; latencies in ms."""
    out: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        r = await call(s, "POST", "/v1/fine_tuning/jobs", json=body, headers=headers)
        out.append((time.perf_counter() - t0) * 1000)
        if r.status != 200 and len(out) == 1:
            print(f"tenant A's create answered {r.status} {json.dumps(r.body)[:300]}", file=sys.stderr, flush=True)
        if r.status == 200:
            t0 = time.perf_counter()
            await call(s, "GET", f"/v1/fine_tuning/jobs/{r.body['id']}", headers=headers)
            out.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.05)
    return out


async def tenant_b(s: aiohttp.ClientSession, key: str, api_port: int, listen_port: int, seconds: float,
                   streams: int, rate: float, catalog: Path, marker: Path, answers: list[str]) -> dict[str, list]:
    headers = {"Authorization": f"Bearer {key}"}
    abuses: dict[str, list] = {}

    async def note(name: str, r, sent: str = "") -> None:
        abuses.setdefault(name, []).append(r.status)
        answers.append(json.dumps(r.body).replace(sent, "") if sent else json.dumps(r.body))   # B's own words aside

    # one job of B's own to stream events of
    own = await call(s, "POST", "/v1/fine_tuning/jobs", headers=headers,
                     json={"model": "tiny-llama", "training_file": "file-b"})
    if own.status != 200:
        print(f"tenant B's own job was refused ({own.status} {json.dumps(own.body)[:300]}): streams will 404",
              file=sys.stderr, flush=True)
    held: list[aiohttp.ClientResponse] = []

    async def open_streams() -> None:
        for _ in range(streams):
            try:
                r = await s.get(f"/v1/fine_tuning/jobs/{own.body.get('id')}/events", params={"stream": "true"},
                                headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
            except aiohttp.ClientError as exc:
                abuses.setdefault("sse_streams", []).append(type(exc).__name__)
                continue
            abuses.setdefault("sse_streams", []).append(r.status)
            if r.status == 200:
                held.append(r)
            else:
                answers.append(await r.text())
                r.release()

    async def flood() -> None:
        """`rate` requests every second on the clock, whether or not the last second's were answered,
        so a platform that answers slowly gets the same abuse as one that answers fast."""
        deadline = time.monotonic() + seconds
        sent: set[asyncio.Task] = set()
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            for _ in range(int(rate)):
                task = asyncio.ensure_future(call(s, "GET", "/v1/fine_tuning/jobs", headers=headers))
                sent.add(task)
                task.add_done_callback(sent.discard)
                task.add_done_callback(lambda t: abuses.setdefault("flood_answers", []).append(
                    "cancelled" if t.cancelled() else type(t.exception()).__name__ if t.exception()
                    else t.result().status))
            abuses.setdefault("requests_per_s", []).append(int(rate))
            await asyncio.sleep(max(0.0, 1 - (time.monotonic() - t0)))
        await asyncio.gather(*sent, return_exceptions=True)

    async def one_offs() -> None:
        head = (f"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n")
        abuses["json_body_200mb"] = [await raw_status(api_port, head, body_bytes=4 << 20)]
        chunked = (f"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                   "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        abuses["json_body_chunked"] = [await raw_status(api_port, chunked + ("10000\r\n" + " " * 65536 + "\r\n") * 24)]
        await note("yaml_bomb", await call(s, "POST", "/v1/templates", data=yaml_bomb(),
                                           headers={**headers, "Content-Type": "application/yaml"}))
        for url in (f"http://127.0.0.1:{listen_port}/", "http://10.0.0.1/", f"http://[::1]:{listen_port}/",
                    "http://169.254.169.254/latest/meta-data/", f"http://0x7f000001:{listen_port}/",
                    f"http://2130706433:{listen_port}/", f"http://localhost:{listen_port}/"):
            r = await call(s, "POST", "/v1/webhooks", json={"url": url}, headers=headers)
            await note("webhook " + url.split("/")[2], r)
            if r.status == 200:   # a broken build accepted it: delete it at once, before any delivery
                await call(s, "DELETE", f"/v1/webhooks/{r.body['id']}", headers=headers)
        for ref in ("/etc", str(catalog / "tiny-llama"), "../models/tiny-llama", "someone/unlisted"):
            await note("base_model " + ref.replace(str(catalog), "<catalog>"), await call(
                s, "POST", "/v1/fine_tuning/jobs", json={"model": ref, "training_file": "file-b"}, headers=headers),
                sent=ref)
        text = PYTHONISH.format(marker=marker)
        for field in ("model", "training_file", "validation_file", "suffix", "template", "tier", "idempotency_key"):
            body = {"model": "tiny-llama", "training_file": "file-b", field: text}
            await note(f"pythonish {field}", await call(s, "POST", "/v1/fine_tuning/jobs", json=body, headers=headers))
        await note("pythonish metadata", await call(s, "POST", "/v1/fine_tuning/jobs", headers=headers, json={
            "model": "tiny-llama", "training_file": "file-b", "metadata": {"k": text}}))
        await note("pythonish template", await call(s, "POST", "/v1/templates", headers=headers,
                                                    json={"name": "t", "model": "tiny-llama", "description": text}))

    # the one-off probes go first, while B's rate is unspent, so each gets its own refusal rather than
    # the 429 of a rate the flood has spent
    await one_offs()
    await asyncio.gather(open_streams(), flood())
    for r in held:
        r.close()
    return abuses


def tenant_b_process(api_port: int, key: str, listen_port: int, seconds: float, streams: int, rate: float,
                     catalog: str, marker: str, out: "multiprocessing.Queue", started: Any) -> None:
    """Tenant B in a process of its own: its 500 stream opens and 50 answers a second are parsed
    here, not in the event loop that times tenant A's requests (one client loop timing A while it
    also served B measured the client, not the platform). It runs at a lower CPU priority: a real
    abuser's client runs on its own machine, and on this one the cores its client process burns
    would be charged to the platform (the platform's own processes, which serve B too, keep theirs)."""
    os.nice(10)

    async def go() -> tuple[dict, list[str]]:
        answers: list[str] = []
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{api_port}",
                                         connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as s:
            started.set()   # tenant A's abused phase starts now, not while this process imports
            abuses = await tenant_b(s, key, api_port, listen_port, seconds, streams, rate, Path(catalog),
                                    Path(marker), answers)
            hooks = await call(s, "GET", "/v1/webhooks", headers={"Authorization": f"Bearer {key}"})
        answers.append(json.dumps({"stored_webhooks": len(hooks.body.get("data", []))
                                   if isinstance(hooks.body, dict) else 0}))
        return abuses, answers
    out.put(asyncio.run(go()))


async def run(args: argparse.Namespace) -> dict:
    from whetstone.contracts import all_topic_partitions
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.identity import internal_secret

    tmp = Path(tempfile.mkdtemp(prefix="bench-abuse-"))
    stack = EmbeddedStack(tmp / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = stack.start()
    tenants = {A: "premium", B: "premium"}
    env = {**os.environ, **endpoints.as_env(), "WHETSTONE_DATA_DIR": str(tmp), "WHETSTONE_TENANTS": json.dumps(tenants),
           "WHETSTONE_LOG_LEVEL": "WARNING", "WHETSTONE_SCHEDULER_UNKNOWN_DATASET_GRACE_S": "36000",
           "WHETSTONE_SCHEDULER_DATASET_WAIT_S": "36000", "WHETSTONE_SCHEDULER_WEBHOOK_ALLOW_HOSTS": "[]",
           "WHETSTONE_SCHEDULER_TENANT_QUOTAS": json.dumps({t: {"max_in_flight": 100000} for t in tenants})}
    sched_port, api_port = free_port(), free_port()
    env.update(WHETSTONE_SCHEDULER_HTTP_PORT=str(sched_port), WHETSTONE_API_PORT=str(api_port),
               WHETSTONE_GATEWAY_UPSTREAMS=json.dumps({"scheduler": f"http://127.0.0.1:{sched_port}"}))
    os.environ.update({k: env[k] for k in ("WHETSTONE_DATA_DIR", "WHETSTONE_TENANTS")})
    build_tiny_model(tmp / "models" / "tiny-llama")
    server = subprocess.Popen([sys.executable, "-c", SERVE_SCHEDULER], env=env, stdout=subprocess.PIPE, text=True)
    edge = subprocess.Popen([sys.executable, "-m", "whetstone.gateway"], env=env)
    procs = {"scheduler": server, "gateway": edge}
    try:
        assert server.stdout is not None
        if "ready" not in await asyncio.to_thread(server.stdout.readline):
            raise SystemExit("scheduler did not start")
        await wait_healthy(f"http://127.0.0.1:{api_port}/healthz")
        from whetstone.cli.keys import create_key
        sched = f"http://127.0.0.1:{sched_port}"
        keys = {t: (await asyncio.to_thread(create_key, t, base_url=sched))["key"] for t in tenants}
        # each tenant's training file, as ingest announces an upload (the scheduler admits jobs only on
        # files of the tenant's own; the bench runs no ingest)
        from whetstone.contracts import DatasetSubmittedV1
        from whetstone.devstack.testing import send_event
        for t, file_id in ((A, "file-a"), (B, "file-b")):
            await send_event(endpoints.kafka_bootstrap, DatasetSubmittedV1(
                dataset_id=file_id, name=f"{file_id}.jsonl", source_uri=f"s3://whetstone/tenants/{t}/uploads/x.jsonl"),
                t)
        body = {"model": "tiny-llama", "training_file": "file-a"}
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{api_port}") as probe:
            deadline = time.monotonic() + 30
            while (await call(probe, "POST", "/v1/fine_tuning/jobs", json=body,
                              headers={"Authorization": f"Bearer {keys[A]}"})).status != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("the scheduler never learnt tenant A's training file")
                await asyncio.sleep(0.3)
        listener, marker = Listener(), tmp / "pwned"
        listen_port = await listener.start()
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{api_port}",
                                         timeout=aiohttp.ClientTimeout(total=120)) as sa:
            quiet, abused, abuses, answers, stored_private = [], [], {}, [], 0
            window = args.seconds / args.rounds
            for round_ in range(1, args.rounds + 1):   # quiet and abused windows alternate: both see the same
                # machine (other work on it drifts over a run; one quiet phase then one abused compared two moments)
                print(f"round {round_}/{args.rounds}, quiet: tenant A alone for {window:g}s", flush=True)
                quiet += await tenant_a(sa, keys[A], window, body)
                print(f"round {round_}/{args.rounds}, abused: tenant A while tenant B runs every abuse "
                      f"({args.streams} streams, {args.rate} req/s)", flush=True)
                ctx = multiprocessing.get_context("spawn")
                results: multiprocessing.Queue = ctx.Queue()
                started = ctx.Event()
                b = ctx.Process(target=tenant_b_process, args=(api_port, keys[B], listen_port, window, args.streams,
                                                               args.rate, str(tmp / "models"), str(marker), results,
                                                               started))
                b.start()
                if not await asyncio.to_thread(started.wait, 120):
                    raise SystemExit("tenant B's process did not start")
                abused += await tenant_a(sa, keys[A], window, body)
                round_abuses, round_answers = await asyncio.to_thread(results.get, True, 300)
                await asyncio.to_thread(b.join, 30)
                for name, codes in round_abuses.items():
                    abuses.setdefault(name, []).extend(codes)
                stored_private = max(stored_private, json.loads(round_answers.pop())["stored_webhooks"])
                answers += round_answers
        await asyncio.sleep(2)   # a delivery a broken build armed would arrive now
        secrets = [internal_secret(tmp).decode(errors="ignore").strip(), keys[A], endpoints.database_url,
                   str(tmp / "models"), "whetstone-secret"]
        leaked = sum(1 for text in answers for secret in secrets if secret and secret in text)
        restarts = sum(1 for p in procs.values() if p.poll() is not None)
        summary = {name: dict(Counter(map(str, codes))) for name, codes in sorted(abuses.items())}
        quiet_p99, abused_p99 = pct(quiet, 99), pct(abused, 99)
        return {"quiet_p99_ms": round(quiet_p99, 1), "abused_p99_ms": round(abused_p99, 1),
                "quiet_ops": len(quiet), "abused_ops": len(abused), "abuses": summary,
                "secrets_leaked": leaked, "private_addresses_reached": listener.connections + stored_private,
                "code_ran": marker.exists(), "service_restarts": restarts,
                "targets": {"abused_p99<=1.5x_quiet": abused_p99 <= 1.5 * quiet_p99, "secrets_leaked==0": leaked == 0,
                            "private_addresses_reached==0": listener.connections + stored_private == 0,
                            "service_restarts==0": restarts == 0}}
    finally:
        stop_processes(edge, server)
        stack.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="length of the quiet and of the abused phase")
    p.add_argument("--rounds", type=int, default=2, help="quiet/abused windows alternate this many times "
                   "(each seconds/rounds long), so drift in the machine's other load falls on both phases")
    p.add_argument("--streams", type=int, default=500, help="event streams tenant B tries to hold open")
    p.add_argument("--rate", type=float, default=50.0, help="tenant B's requests per second")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
