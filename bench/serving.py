"""Serving benchmark: many LoRA adapters on one base, mixed-adapter batches vs one adapter at a time.

1. an embedded stack (Kafka, Postgres, S3) and the serving service in this process;
2. N random PEFT LoRA adapters (default 56) on the tiny Llama, stored in S3 with a sha256
   manifest like the trainer's final checkpoints, announced with model.registered (dev);
3. promotion -> first answer: for each of the first P adapters (default 50), model.promoted
   (dev -> staging) is published and a client polls /v1/chat/completions until the new adapter
   answers (the rest are promoted together); a watcher in this process notes when the projection
   in memory shows the promotion and when the adapter is resident (the split of that time).
   Cold loads (S3 -> ready) are timed by the adapter pool;
4. throughput: the same R requests (random adapters, greedy, max_tokens T) sent at once over
   HTTP, served with mixed-adapter batches and with the baseline: what a server without mixed
   batches does, one adapter per forward pass with the requests grouped per adapter (continuous
   batching within one adapter, up to the same batch size). One untimed round in each mode warms
   both paths up; then the timed rounds run mixed, one-adapter, one-adapter, mixed (ABBA, so a
   drift of the machine's load weighs on both alike), --rounds times; the figures are each mode's
   median round (the sums over all rounds are printed too); the answers must be identical in both
   modes. The requests come from a separate client process, so the load generator does not share
   the server's event loop;
   then the engine alone (no HTTP): one batch of rows on as many adapters (up to --batch) vs the
   same rows one adapter at a time, on the engine's worker thread;
5. rollback: version B replaces A in production; then the rollback events (B archived, A back
   to production) are published and the time until A answers again is measured.

Last line: JSON.

    .venv/bin/python bench/serving.py [--adapters 56] [--requests 192] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
import httpx
from aiokafka import AIOKafkaProducer

from whetstone.contracts import TOPICS, all_topic_partitions
from whetstone.devstack.stack import EmbeddedStack
from whetstone.runtime.identity import IdentityAuth, identity_headers
from whetstone.runtime.signing import Bound
from whetstone.runtime.messaging import encode, make_envelope

BASE = "tiny-llama"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))], 1)


class Publisher:
    def __init__(self, bootstrap: str) -> None:
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")

    async def __aenter__(self) -> Publisher:
        await self.producer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.producer.stop()

    async def send(self, event, tenant: str = "demo") -> None:
        env = make_envelope(event, producer="bench", tenant_id=tenant)
        await self.producer.send_and_wait(TOPICS[event.EVENT_TYPE].name, encode(env), key=env.key.encode())


async def ask(http: httpx.AsyncClient, model: str, max_tokens: int, user: str | None = None) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    if user:
        body["user"] = user
    # signed identity as the gateway forwards it (fresh: it expires after 5 minutes)
    return await http.post("/v1/chat/completions", json=body, auth=IdentityAuth("demo", ("read",)))


async def until_served(http: httpx.AsyncClient, model: str, version: str, timeout: float = 30) -> float:
    """Poll every 10 ms; the moment `version` answers for `model` (perf_counter)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        r = await ask(http, model, 1)
        if r.status_code == 200 and r.headers.get("x-whetstone-model-version") == version:
            return time.perf_counter()
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{model} not served by {version} within {timeout}s")


async def watch(rt, model_id: str, published: float, timeout: float = 30) -> tuple[float, float]:
    """(ms until the projection in memory shows model_id servable, ms until it is resident)."""
    seen = None
    deadline = published + timeout
    while time.perf_counter() < deadline:
        version = rt.ctx.catalog.versions.get(model_id)
        if seen is None and version is not None and version.servable:
            seen = time.perf_counter()
        if seen is not None and rt.ctx.pool.resident(model_id):
            return (seen - published) * 1000, (time.perf_counter() - published) * 1000
        await asyncio.sleep(0.005)
    raise TimeoutError(f"{model_id} not resident within {timeout}s")


def engine_only(engine, prompt_ids: list[int], adapters: list[str], max_tokens: int) -> dict:
    """On the worker thread: one mixed batch of len(adapters) rows vs one adapter per batch."""
    from whetstone.serving.adapters.engine import GenRow

    def rows():
        return [GenRow(adapter=a, prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=0, stream=False,
                       emit=lambda d, f: None) for a in adapters]

    figures = {}
    for mixed in (True, False, True, False):
        batch = rows()
        started = time.perf_counter()
        if mixed:
            engine.generate(batch, mixed=True)
        else:
            for row in batch:
                engine.generate([row], mixed=False)
        seconds = time.perf_counter() - started
        tokens = sum(r.completion_tokens for r in batch)
        got = figures.setdefault(mixed, [0, 0.0])
        got[0] += tokens
        got[1] += seconds
    mixed_tps, single_tps = (figures[m][0] / figures[m][1] for m in (True, False))
    return {"rows": len(adapters), "mixed_tokens_per_s": round(mixed_tps, 1),
            "one_adapter_at_a_time_tokens_per_s": round(single_tps, 1), "ratio": round(mixed_tps / single_tps, 2)}


async def _round(url: str, requests: list[str], max_tokens: int
                 ) -> tuple[int, float, list[str]]:
    # the load generator is aiohttp, one connection per request in flight: httpx costs this 2-core
    # machine about 1.7 ms of CPU per request (see bench/api.py), CPU the server under test then lacks
    async def one(session: aiohttp.ClientSession, model: str) -> dict:
        body = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}).encode()
        headers = {"Content-Type": "application/json",   # signed for this request, as the gateway forwards it
                   **identity_headers("demo", ("read",), bound=Bound.of("POST", "/v1/chat/completions", body))}
        async with session.post("/v1/chat/completions", data=body, headers=headers) as reply:
            return await reply.json()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(base_url=url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        started = time.perf_counter()
        bodies = await asyncio.gather(*(one(session, m) for m in requests))
        elapsed = time.perf_counter() - started
    bad = [b for b in bodies if "choices" not in b]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed, e.g. {bad[0]}")
    return (sum(b["usage"]["completion_tokens"] for b in bodies), elapsed,
            [b["choices"][0]["message"]["content"] for b in bodies])


def client_round(url: str, data_dir: str, requests: list[str], max_tokens: int) -> tuple[int, float, list[str]]:
    """One round of the request stream, sent from a separate client process (its own CPU and
    event loop, like real callers): all requests at once."""
    os.environ["WHETSTONE_DATA_DIR"] = data_dir  # where the internal secret that signs identities lives
    return asyncio.run(_round(url, requests, max_tokens))


async def run(args: argparse.Namespace, tmp: Path) -> dict:
    from whetstone.devstack.serving_samples import make_adapter, promoted, registered, store_adapter
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.models import weights_sha256
    from whetstone.runtime.s3 import ObjectStore
    from whetstone.runtime.service import run_services
    from whetstone.runtime.settings import CommonSettings
    from whetstone.serving.bootstrap import build_service
    from whetstone.serving.config import ServingSettings

    stack = EmbeddedStack(tmp / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = stack.start()
    try:
        os.environ.update(endpoints.as_env())
        os.environ["WHETSTONE_DATA_DIR"] = str(tmp)
        os.environ["HF_HUB_OFFLINE"] = "1"
        settings = CommonSettings(log_level="WARNING")
        base_dir = build_tiny_model(settings.model_catalog / BASE)
        sha = weights_sha256(base_dir)
        store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
        t = time.perf_counter()
        adapters = []
        for i in range(args.adapters):
            local = make_adapter(base_dir, tmp / "adapters" / f"a{i}", seed=i, r=8)
            adapters.append(store_adapter(store, local, "demo", f"wsm-bench-{i:03d}",
                                          f"ft:tiny-llama:demo:bench-{i:03d}"))
        print(f"{len(adapters)} adapters made and stored in {time.perf_counter() - t:.1f}s", flush=True)
        roll_a = store_adapter(store, tmp / "adapters" / "a0", "demo", "wsm-roll-a", "ft:tiny-llama:demo:roll")
        roll_b = store_adapter(store, tmp / "adapters" / "a1", "demo", "wsm-roll-b", "ft:tiny-llama:demo:roll")
        # every request of a round comes from one tenant at once: the operator's per-tenant queue cap is
        # raised to the round's size, as for a one-tenant replica (bench-abuse measures the cap itself)
        config = ServingSettings(http_port=0, max_resident_adapters=max(64, args.adapters + 2),
                                 max_batch_size=args.batch, batch_window_ms=4.0, torch_threads=args.threads,
                                 max_queued_per_tenant=max(args.requests, 32))
        stop, ready = asyncio.Event(), {}
        service = asyncio.create_task(run_services([build_service(config)], settings,
                                                   lambda rts: ready.update({r.name: r for r in rts}), stop))
        while not ready:
            if service.done():
                service.result()
            await asyncio.sleep(0.05)
        rt = ready["serving"]
        url = f"http://127.0.0.1:{rt.http.port}"
        loop = asyncio.get_running_loop()
        client_process = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

        async def throughput(requests: list[str], max_tokens: int) -> tuple[int, float, list[str]]:
            return await loop.run_in_executor(client_process, client_round, url, str(tmp), requests,
                                              max_tokens)

        async with Publisher(settings.kafka_bootstrap) as pub, httpx.AsyncClient(base_url=url, timeout=300) as http:
            for a in (*adapters, roll_a, roll_b):
                await pub.send(registered(a, base_model=BASE, base_sha256=sha))
            # promotion -> first answer, one adapter at a time
            promo_ms, projected_ms, resident_ms = [], [], []
            for a in adapters[:args.promotions]:
                await pub.send(promoted(a, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=1))
                published = time.perf_counter()
                watcher = asyncio.create_task(watch(rt, a.model_id, published))
                promo_ms.append((await until_served(http, a.name, a.model_id) - published) * 1000)
                projected, resident = await watcher
                projected_ms.append(projected)
                resident_ms.append(resident)
            for a in adapters[args.promotions:]:
                await pub.send(promoted(a, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=1))
            await asyncio.gather(*(until_served(http, a.name, a.model_id) for a in adapters[args.promotions:]))
            print(f"promotion -> first answer over {len(promo_ms)} adapters: p50 {pct(promo_ms, 50)} ms, "
                  f"p95 {pct(promo_ms, 95)} ms, p99 {pct(promo_ms, 99)} ms; of which event -> projection in "
                  f"memory p50 {pct(projected_ms, 50)} / p99 {pct(projected_ms, 99)} ms, -> adapter resident "
                  f"p50 {pct(resident_ms, 50)} / p99 {pct(resident_ms, 99)} ms", flush=True)

            # the same mixed request stream, both modes, alternating
            rng = random.Random(7)
            stream = [rng.choice(adapters).name for _ in range(args.requests)]
            totals = {True: [0, 0.0], False: [0, 0.0]}
            rows_per_pass = {True: [0, 0], False: [0, 0]}
            per_round: dict[bool, list[float]] = {True: [], False: []}
            answers: dict[bool, list[str]] = {}
            for mixed in (True, False):  # warm-up of both paths, not timed (and the client process started)
                rt.ctx.batcher.mixed = mixed
                await throughput(stream, args.max_tokens)
            load_before = os.getloadavg()[0]
            for mixed in (True, False, False, True) * args.rounds:
                rt.ctx.batcher.mixed = mixed
                steps, step_rows = rt.ctx.batcher.steps, rt.ctx.batcher.step_rows
                tokens, seconds, texts = await throughput(stream, args.max_tokens)
                rows_per_pass[mixed][0] += rt.ctx.batcher.steps - steps
                rows_per_pass[mixed][1] += rt.ctx.batcher.step_rows - step_rows
                totals[mixed][0] += tokens
                totals[mixed][1] += seconds
                per_round[mixed].append(tokens / seconds)
                answers.setdefault(mixed, texts)
                print(f"{'mixed batches' if mixed else 'one adapter at a time'}: {tokens} tokens in {seconds:.2f}s "
                      f"= {tokens / seconds:.0f} tokens/s", flush=True)
            load_after = os.getloadavg()[0]
            rt.ctx.batcher.mixed = True
            identical = answers[True] == answers[False]
            prompt_ids = rt.ctx.engine.encode(rt.ctx.engine.render_chat(MESSAGES, None))
            engine_alone = await rt.ctx.batcher.run_op(
                lambda: engine_only(rt.ctx.engine, prompt_ids, [a.model_id for a in adapters[:args.batch]],
                                    args.max_tokens))
            print(f"engine alone, {engine_alone['rows']} rows on as many adapters: mixed "
                  f"{engine_alone['mixed_tokens_per_s']} vs one adapter at a time "
                  f"{engine_alone['one_adapter_at_a_time_tokens_per_s']} tokens/s = {engine_alone['ratio']}x",
                  flush=True)

            # rollback: B replaced A in production; roll back to A
            await pub.send(promoted(roll_a, "dev", "production", base_model=BASE, base_sha256=sha, sequence=1))
            await until_served(http, roll_a.name, roll_a.model_id)
            await pub.send(promoted(roll_a, "production", "archived", base_model=BASE, base_sha256=sha, sequence=2))
            await pub.send(promoted(roll_b, "dev", "production", base_model=BASE, base_sha256=sha, sequence=3))
            await until_served(http, roll_b.name, roll_b.model_id)
            await asyncio.sleep(0.5)  # A is unloaded on archive: the rollback includes its cold load
            await pub.send(promoted(roll_b, "production", "archived", base_model=BASE, base_sha256=sha, sequence=4))
            await pub.send(promoted(roll_a, "archived", "production", base_model=BASE, base_sha256=sha, sequence=5))
            published = time.perf_counter()
            rollback_ms = (await until_served(http, roll_a.name, roll_a.model_id) - published) * 1000
        client_process.shutdown()
        cold = list(rt.ctx.pool.cold_load_ms)
        stop.set()
        await service
    finally:
        stack.stop()
    # the headline is the median round of each mode: one round of the mixed mode lasts about half a
    # second, so one burst of another process's CPU can halve it; the sums over all rounds are given too
    mixed_tps, single_tps = statistics.median(per_round[True]), statistics.median(per_round[False])
    summed = {m: totals[m][0] / totals[m][1] for m in (True, False)}
    return {"adapters": len(adapters), "requests": args.requests, "max_tokens": args.max_tokens,
            "timed_rounds_per_mode": len(per_round[True]),
            "mixed_batch_tokens_per_s": round(mixed_tps, 1), "one_adapter_at_a_time_tokens_per_s": round(single_tps, 1),
            "mixed_vs_one_at_a_time": round(mixed_tps / single_tps, 2),
            "over_all_rounds": {"mixed_batch_tokens_per_s": round(summed[True], 1),
                                "one_adapter_at_a_time_tokens_per_s": round(summed[False], 1),
                                "mixed_vs_one_at_a_time": round(summed[True] / summed[False], 2)},
            "answers_identical": identical,
            "baseline": "one adapter per forward pass, requests grouped per adapter",
            "torch_threads": rt.ctx.engine.threads,
            "load_avg_1min": {"before": round(load_before, 2), "after": round(load_after, 2), "cores": os.cpu_count()},
            "cold_loads": len(cold), "cold_load_ms_p50": pct(cold, 50), "cold_load_ms_p99": pct(cold, 99),
            "engine_only": engine_alone, "promotions": len(promo_ms),
            "promotion_to_first_answer_ms_p50": pct(promo_ms, 50), "promotion_to_first_answer_ms_p95": pct(promo_ms, 95),
            "promotion_to_first_answer_ms_p99": pct(promo_ms, 99),
            "promotion_to_projection_ms_p50": pct(projected_ms, 50), "promotion_to_projection_ms_p99": pct(projected_ms, 99),
            "promotion_to_resident_ms_p50": pct(resident_ms, 50), "promotion_to_resident_ms_p99": pct(resident_ms, 99),
            "rollback_ms": round(rollback_ms, 1),
            "targets_met": {"mixed_3x": mixed_tps >= 3 * single_tps, "promotion_p99_le_2s": pct(promo_ms, 99) <= 2000,
                            "rollback_le_1s": rollback_ms <= 1000},
            "mean_rows_per_forward_pass": {"mixed": round(rows_per_pass[True][1] / max(rows_per_pass[True][0], 1), 1),
                                           "one_adapter": round(rows_per_pass[False][1] / max(rows_per_pass[False][0], 1), 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=56)
    parser.add_argument("--promotions", type=int, default=50, help="adapters promoted one at a time (timed)")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds: mixed, one-at-a-time, one-at-a-time, mixed; this many times")
    parser.add_argument("--batch", type=int, default=64, help="max rows per forward pass (the server's default)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the server's default, all cores but one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wt-bench-serving-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
