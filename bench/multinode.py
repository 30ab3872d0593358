"""Multi-node bench (issue 40 point 1): one gang job across two trainer-agent processes, and the same job
on one node with the gang's effective batch, both through the whole platform (embedded stack, the six
services, the gateway, the official `openai` client).

The other five services run in this process; node-a and node-b are two `python -m whetstone.trainer_agent`
processes, as on two machines. Each offers one CPU slot. The gang job asks for
`{"gpu_type": "cpu", "gpus_per_node": 1, "nodes": 2}` (DDP over gloo, micro-batch B per rank); the
reference asks for one node with micro-batch 2B. The loss curves come from each job's metric events
(every step: the agents report progress every 10 ms).

Last line JSON: nodes, status, loss_max_rel_diff, tolerance, billed_node_segments (node segments metering
billed for the gang job: its segment lines' gpu_count / gpus_per_node, each line a charge), plus
steps_within_tolerance and rel_diff_by_step (the two curves step by step), rows_kept (the training rows
ingest kept), steps, wall times and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

NO_GATE = {"stages": {"benchmarks": False, "holdout": False, "safety": False, "judge": False}}


def rows(n: int) -> bytes:
    return b"".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                             {"role": "assistant", "content": f"It is {i + 1}."}]}).encode() + b"\n"
                    for i in range(n))


async def wait_for(fetch, done, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await fetch()
        if done(value):
            return value
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


async def run_job(client, file_id: str, hp: dict[str, Any], resources: dict[str, Any] | None,
                  timeout_s: float) -> dict[str, Any]:
    """Create a job, wait for its end; its status, per-step losses, usage lines and wall time."""
    started = time.monotonic()
    extra: dict[str, Any] = {"eval_config": NO_GATE, **({"resources": resources} if resources else {})}
    job = await client.fine_tuning.jobs.create(model="tiny-llama", training_file=file_id, extra_body=extra,
                                               method={"type": "supervised", "supervised": {"hyperparameters": hp}})
    done = await wait_for(lambda: client.fine_tuning.jobs.retrieve(job.id),
                          lambda j: j.status in ("succeeded", "failed", "cancelled"), timeout_s, f"job {job.id}")
    wall = time.monotonic() - started
    losses: dict[int, float] = {}
    async for ev in client.fine_tuning.jobs.list_events(job.id, limit=100):
        data = ev.data if isinstance(ev.data, dict) else {}
        if ev.type == "metrics" and data.get("loss") is not None:
            losses[int(data["step"])] = float(data["loss"])

    async def bill() -> httpx.Response:
        return await client.get(f"/usage/jobs/{job.id}", cast_to=httpx.Response)
    usage = (await wait_for(bill, lambda r: r.status_code == 200 and (r.json().get("total") or {}).get("outcome"),
                            60, f"usage of {job.id}")).json() if done.status == "succeeded" else {"lines": []}
    return {"id": job.id, "status": done.status, "error": done.error.model_dump() if done.error else None,
            "losses": [losses[s] for s in sorted(losses)], "wall_s": round(wall, 1),
            "segments": [x for x in usage["lines"] if x["scope"] == "segment"]}


async def bench(root: Path, n_rows: int, batch: int) -> dict[str, Any]:
    from whetstone.devstack.multinode import LOSS_TOLERANCE, max_rel_diff
    from whole_platform import running_platform

    env = {"WHETSTONE_EVAL_TIERS_MAY_SKIP_SAFETY": '["standard"]',
           "WHETSTONE_SCHEDULER_NODE_TIMEOUT_S": "120",   # a loaded machine's slow agent is no lost node
           **{f"WHETSTONE_TRAINER_AGENT_{k}": v for k, v in {
               "ADDRESS": "127.0.0.1", "PROGRESS_INTERVAL_S": "0.01", "HEARTBEAT_S": "0.5"}.items()}}
    async with running_platform(root, env=env, agent_nodes=("node-a", "node-b")) as p:
        client = p.client
        pool = p.runtimes["scheduler"].pool
        await wait_for(lambda: pool.fetchval("SELECT count(*) FROM scheduler.nodes"), lambda n: n == 2, 120,
                       "both nodes heartbeating")
        training = await client.files.create(file=("train.jsonl", rows(n_rows)), purpose="fine-tune")
        checked = await wait_for(lambda: client.files.retrieve(training.id), lambda f: f.status != "uploaded", 120,
                                 "file validation")
        kept = int((checked.model_extra or {}).get("validation", {}).get("rows_kept") or n_rows)
        # lora_dropout 0: each rank draws its own dropout masks, which a one-process run cannot repeat
        hp = {"n_epochs": 1, "batch_size": batch, "max_seq_len": 48, "lora_r": 4, "seed": 0,
              "learning_rate_multiplier": 2, "checkpoint_every_steps": 1000, "lora_dropout": 0.0}
        gang = await run_job(client, training.id, hp, {"gpu_type": "cpu", "gpus_per_node": 1, "nodes": 2}, 900)
        single = await run_job(client, training.id, {**hp, "batch_size": 2 * batch}, None, 900)
    per_step = [max_rel_diff([a], [b]) for a, b in zip(gang["losses"], single["losses"], strict=False)]
    charged = [s for s in gang["segments"] if s["entry"] == "charge"]
    return {"gang": gang, "single": single, "nodes": 2, "status": gang["status"],
            "loss_max_rel_diff": max_rel_diff(gang["losses"], single["losses"]), "tolerance": LOSS_TOLERANCE,
            "steps_within_tolerance": sum(d <= LOSS_TOLERANCE for d in per_step),
            "rel_diff_by_step": [float(f"{d:.2g}") for d in per_step], "rows_kept": kept,
            "billed_node_segments": sum(s["gpu_count"] for s in charged),
            "steps": len(gang["losses"]), "gang_wall_s": gang["wall_s"], "single_wall_s": single["wall_s"],
            "load_avg": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="training rows (steps = rows / (2 x batch))")
    parser.add_argument("--batch", type=int, default=2, help="micro-batch per rank of the gang")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-multinode-") as tmp:
        result = asyncio.run(bench(Path(tmp), args.rows, args.batch))
    for name in ("gang", "single"):
        print(json.dumps({name: result.pop(name)}))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
