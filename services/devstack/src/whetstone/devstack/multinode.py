"""Loss parity of a multi-node (gang) job, for `make bench-multinode`.

The reference is a one-node job through the same platform on the same data, seed and
hyperparameters, its micro-batch the gang's effective batch (nodes x the gang's per-rank batch). DDP keeps the gang's data order (the seeded
sampler's permutation does not depend on the world size; rank r takes the r-th micro-batch of each
global batch), averages the ranks' gradients, and the Trainer logs the mean of the ranks' losses: the
two curves are the same computation, reduced in a different order. Only without dropout
(`lora_dropout` 0): each rank draws its own dropout masks, which one process cannot repeat (the
platform's default 0.05 put the curves 1.7e-2 apart by the fourth step).

`LOSS_TOLERANCE`: fp32 sums of the same terms in another order differ by a few ulp (about 1e-7
relative); a few Adam steps on a tiny model carry that through without amplifying it much (measured
1.2e-7 over 8 steps on this machine). 1e-4 leaves three orders of margin for that and still catches
a real divergence: a gang that skipped the all-reduce, or split the batch differently, is off by
1e-2 or more from the second step on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOSS_TOLERANCE = 1e-4


def max_rel_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest |a_i - b_i| / |b_i| over the steps both curves have; inf when their lengths differ."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ gang tests: nodes as processes


def sample_rows(n: int) -> bytes:
    """`n` chat rows of a training file (JSONL)."""
    return b"".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                             {"role": "assistant", "content": f"It is {i + 1}."}]}).encode() + b"\n"
                    for i in range(n))


def start_agent(node: str, log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A trainer agent as its own process, as on another machine: node id `node`, its log appended to `log`,
    `env` on top of this process's environment (WHETSTONE_TRAINER_AGENT_* settings, test faults)."""
    full = {**os.environ, "WHETSTONE_TRAINER_AGENT_NODE_ID": node, "WHETSTONE_TRAINER_AGENT_HTTP_PORT": "0",
            **(env or {})}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "whetstone.trainer_agent"], env=full, stdout=out,
                                stderr=subprocess.STDOUT)


def stop_agent(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
    """SIGTERM (the agent drains: emergency checkpoints, then exits), SIGKILL past `timeout_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def processes_naming(marker: str) -> list[str]:
    """Command lines of this machine's live processes that name `marker` (a segment id: its launcher and
    ranks read `<scratch>/<segment id>/config.json`), this process excluded; a zombie has no command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:   # gone meanwhile
            continue
        if marker in cmdline:
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


# a two-node CPU gang (one slot per node) and an eval config that gates nothing: the gang tests' job shape
GANG = {"gpu_type": "cpu", "gpus_per_node": 1, "nodes": 2}
NO_GATE = {"stages": {"benchmarks": False, "holdout": False, "safety": False, "judge": False}}


async def create_gang_job(conn: Any, client: Any, rows: bytes, hyperparameters: Mapping[str, Any]) -> Any:
    """Once both nodes heartbeat: `rows` uploaded through the official client, validated, and a supervised
    gang job created on them (`conn`: asyncpg connection to the stack's database; `client`: AsyncOpenAI)."""
    from .testing import until  # noqa: PLC0415

    await until(lambda: conn.fetchval("SELECT count(*) FROM scheduler.nodes"), lambda n: n == 2, 90,
                "both nodes heartbeating")
    training = await client.files.create(file=("train.jsonl", rows), purpose="fine-tune")
    await until(lambda: client.files.retrieve(training.id), lambda f: f.status != "uploaded", 120, "validation")
    return await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=training.id,
        method={"type": "supervised", "supervised": {"hyperparameters": dict(hyperparameters)}},
        extra_body={"eval_config": NO_GATE, "resources": GANG})
