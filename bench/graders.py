"""Grader run latency per grader type (targets: p99 <= 50 ms for string_check and
text_similarity, <= 500 ms for a sandboxed python grader).

Two measurements per type, one request at a time: `engine` calls `run_grader` in this process;
`http` posts to `POST /v1/fine_tuning/alpha/graders/run` of the scheduler's grader routes served by
uvicorn in a separate process on 127.0.0.1 (signed identity as the gateway sends it; no gateway hop, no Kafka or
PostgreSQL: the route touches neither). text_similarity cycles through every lexical metric on a
~60-word answer; multi combines string_check and rouge_l; python runs in the bubblewrap sandbox.
Last line: JSON with grader_run_ms_p99 per type (the http figure) and the engine's beside it.

    python bench/graders.py [--n 200] [--n-python 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time

ANSWER = ("The capital of France is Paris, a city on the Seine known for its museums, its cafes and "
          "the Eiffel Tower, built in 1889 for the World's Fair; it has been the seat of government "
          "since the tenth century and is home to more than two million people in the city proper.")
REFERENCE = ("Paris is the capital of France. It lies on the Seine, is known for the Louvre and the Eiffel "
             "Tower (1889), has been the seat of French government for centuries and has over two "
             "million inhabitants.")
ITEM = {"answer": "Paris", "reference": REFERENCE}
METRICS = ["fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]


def graders() -> dict[str, list[dict]]:
    exact = {"type": "string_check", "name": "exact", "input": "{{sample.output_json.answer}}",
             "reference": "{{item.answer}}", "operation": "eq"}
    similar = [{"type": "text_similarity", "name": m, "input": "{{sample.output_json.explanation}}",
                "reference": "{{item.reference}}", "evaluation_metric": m} for m in METRICS]
    return {
        "string_check": [exact],
        "text_similarity": similar,
        "multi": [{"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * rouge_l",
                   "graders": {"exact": exact, "rouge_l": similar[-1]}}],
        "python": [{"type": "python", "name": "py", "source":
                    "def grade(sample, item):\n"
                    "    out = sample['output_json'] or {}\n"
                    "    return float(out.get('answer') == item['answer'])\n"}],
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_forever(port: int) -> None:
    """The scheduler's grader routes alone, in their own process (a server thread here would share
    this process's GIL with the client and add its switch interval to every request)."""
    import uvicorn
    from fastapi import FastAPI
    from whetstone.runtime.errors import install_error_handlers
    from whetstone.graders.engine import GraderEnvironment
    from whetstone.scheduler.entrypoints import graders_api

    app = FastAPI()
    install_error_handlers(app)
    app.include_router(graders_api.router(GraderEnvironment()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


def serve(port: int):
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(target=serve_forever, args=(port,), daemon=True)
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the grader routes did not start within 60 s")


async def measure(n: dict[str, int], sample: str) -> dict[str, dict[str, float]]:
    import httpx
    from whetstone.graders import GraderEnvironment, parse_grader, run_grader
    from whetstone.runtime.identity import IdentityAuth

    env = GraderEnvironment()
    port = free_port()
    server = serve(port)
    out: dict[str, dict[str, float]] = {}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for kind, defs in graders().items():
                engine, http = [], []
                for i in range(n[kind] + 3):          # 3 warm-up runs are not counted
                    data = defs[i % len(defs)]
                    began = time.perf_counter()
                    result = await run_grader(parse_grader(data), sample, ITEM, env)
                    took = (time.perf_counter() - began) * 1000
                    assert not result.metadata.errors.any(), result.metadata.errors
                    began = time.perf_counter()
                    resp = await client.post("/v1/fine_tuning/alpha/graders/run",
                                             json={"grader": data, "model_sample": sample, "item": ITEM},
                                             auth=IdentityAuth("bench", ("read", "write")))
                    took_http = (time.perf_counter() - began) * 1000
                    assert resp.status_code == 200, resp.text
                    if i >= 3:
                        engine.append(took)
                        http.append(took_http)
                out[kind] = {"n": len(http), "engine_p50": statistics.median(engine),
                             "engine_p99": percentile(engine, 99), "http_p50": statistics.median(http),
                             "http_p99": percentile(http, 99)}
                print(f"{kind:16s} n={len(http):4d}  engine p50 {out[kind]['engine_p50']:7.2f} ms  "
                      f"p99 {out[kind]['engine_p99']:7.2f} ms   http p50 {out[kind]['http_p50']:7.2f} ms  "
                      f"p99 {out[kind]['http_p99']:7.2f} ms", flush=True)
    finally:
        server.terminate()
        server.join(timeout=10)
        await env.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="runs per in-process grader type")
    p.add_argument("--n-python", type=int, default=60, help="runs of the sandboxed python grader")
    args = p.parse_args(argv)
    sample = json.dumps({"answer": "Paris", "explanation": ANSWER})
    n = {"string_check": args.n, "text_similarity": args.n, "multi": args.n, "python": args.n_python}
    began = time.perf_counter()
    out = asyncio.run(measure(n, sample))
    targets = {"string_check": 50.0, "text_similarity": 50.0, "multi": 50.0, "python": 500.0}
    print(json.dumps({
        "grader_run_ms_p99": {k: round(v["http_p99"], 2) for k, v in out.items()},
        "grader_engine_ms_p99": {k: round(v["engine_p99"], 2) for k, v in out.items()},
        "targets_ms": targets,
        "met": all(out[k]["http_p99"] <= t for k, t in targets.items()),
        "wall_s": round(time.perf_counter() - began, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
