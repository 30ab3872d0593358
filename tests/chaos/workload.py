"""The chaos workload: ≥ 30 small jobs (mixed SFT/DPO on the tiny Llama, a few steps each), each with its
own dataset upload (so ingest always has work), some free-tier jobs preempted by premium ones, some
failing with user errors (a dataset ingest rejects, a hyperparameter the trainer refuses). Seeded."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

CHAT = Path(__file__).resolve().parents[2] / "examples" / "datasets" / "chat_demo.jsonl"
# few steps: 40 rows / batch 8 = 5 steps an epoch, a checkpoint every 2 steps
HYPERPARAMETERS = {"n_epochs": 1, "learning_rate": 2e-3, "batch_size": 8, "max_seq_len": 128,
                   "checkpoint_every_steps": 2, "lora_r": 4}
# the eval gate with its safety stage only (the tiny model refuses as little as its base: it passes): a few
# steps of a random model cannot pass the quality stages, which the gate's own tests cover
EVAL_CONFIG = {"stages": {"benchmarks": False, "holdout": False, "judge": False}}
TENANT_OF_TIER = {"standard": "demo", "premium": "acme", "free": "hobbyist"}


@dataclass
class JobPlan:
    index: int
    kind: str          # sft | dpo | bad_dataset | bad_hyperparameter | premium
    tenant: str
    purpose: str       # the dataset's: sft | dpo
    rows: list[dict]
    body: dict = field(default_factory=dict)
    expect: str = "succeeded"   # succeeded | failed (user error)

    @property
    def key(self) -> str:
        return f"chaos-{self.index}"


def chat_rows(rng: random.Random, n: int) -> list[dict]:
    lines = [json.loads(x) for x in CHAT.read_text().splitlines() if x.strip()]
    return rng.sample(lines, n)


def preference_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"input": {"messages": [{"role": "user", "content": f"What is {a} + {b}? ({i})"}]},
                     "preferred_output": [{"role": "assistant", "content": f"{a} + {b} = {a + b}."}],
                     "non_preferred_output": [{"role": "assistant", "content": f"I think it is {a + b + 7}."}]})
    return rows


def bad_rows(rng: random.Random, n: int) -> list[dict]:
    """Chat rows whose every conversation ends with the user: nothing to learn, ingest rejects the file."""
    return [{"messages": [{"role": "user", "content": f"question {rng.random()}"}]} for _ in range(n)]


def plan(seed: int, jobs: int = 32) -> list[JobPlan]:
    rng = random.Random(seed)
    kinds = (["sft"] * 12 + ["dpo"] * 8 + ["premium"] * 5 + ["bad_dataset"] * 4 + ["bad_hyperparameter"] * 3)
    kinds = (kinds * (jobs // len(kinds) + 1))[:jobs]
    rng.shuffle(kinds)
    # premium jobs arrive in the second half, when free-tier work fills both nodes: they preempt it
    premium = [k for k in kinds if k == "premium"]
    rest = [k for k in kinds if k != "premium"]
    half = len(rest) // 2
    kinds = rest[:half] + [x for pair in zip(rest[half:], premium) for x in pair] + rest[half + len(premium):]
    out = []
    for i, kind in enumerate(kinds):
        tier = "premium" if kind == "premium" else rng.choice(["free", "free", "standard"])
        purpose = "dpo" if kind == "dpo" else "sft"
        rows = {"dpo": lambda: preference_rows(rng, 40), "bad_dataset": lambda: bad_rows(rng, 30)}.get(
            kind, lambda: chat_rows(rng, 40))()
        hp = dict(HYPERPARAMETERS)
        if kind == "bad_hyperparameter":
            hp["lora_target_modules"] = ["no_such_proj"]   # the tiny Llama has no such module
        method = {"type": "dpo", "dpo": {"hyperparameters": hp}} if kind == "dpo" else \
            {"type": "supervised", "supervised": {"hyperparameters": hp}}
        job = JobPlan(i, kind, TENANT_OF_TIER[tier], purpose, rows,
                      expect="failed" if kind.startswith("bad_") else "succeeded")
        job.body = {"model": "tiny-llama", "method": method, "suffix": f"chaos{i}", "eval_config": EVAL_CONFIG}
        out.append(job)
    return out
