"""Reinforcement fine-tuning on this CPU, through the real platform (bench/whole_platform.py).

Task: answer any prompt with the row's `target` ("the the the the the the the the"). Grader: a
multi grader, 0.8 x `fuzzy_match` + 0.2 x `rouge_1` between `{{sample.output_text}}` and
`{{item.target}}`. Why it has reward variance from the first step: fuzzy_match is a continuous
character-level score, so the completions a random tiny model samples for one prompt already differ
in reward (a binary check would give most groups zero variance, hence zero advantage and no
gradient); rouge_1 pays for the word itself once the model produces it.

Path, as a tenant's code takes it with the official `openai` client through the gateway: the
training prompts (40) and held-out prompts (16, other numbers) uploaded with the files API (ingest
validates them as rft data) -> `fine_tuning.jobs.create(method={"type": "reinforcement", ...})` (the
scheduler checks the grader and queues the job) -> the trainer agent runs the GRPO child (LoRA, the
grader as reward) -> the eval gate grades greedy completions of the held-out prompts from the base
and the candidate with the job's grader (holdout stage, margin 0.05; safety runs as for every job)
-> the registry records the model with the verdict. reward_base and reward_candidate are the gate's
own numbers (the holdout stage's `holdout_reward` metric in the registered model's lineage).

The planted candidate: a second job, same data, whose grader is the inverted reward (a multi grader
with `calculate_output = 1 - (0.8 * close + 0.2 * words)`), trained through the same path. Its own
gate judges it under that inverted grader; then its adapter is judged under the real grader: the
bench puts an `eval.requested` command on the bus (as the registry does for a re-evaluation) naming
the graded job (its grader, held-out prompts, base SHA and gate settings) and the planted model's
artifact; `inverted_gate_verdict` is the eval service's answer (`eval.completed` with the request id).

Grader latency: `client.fine_tuning.alpha.graders.run` through the gateway on the running platform
(one request at a time, after training; the graders of bench/graders.py). Last line JSON: reward_base,
reward_candidate, steps, wall_s, gate_verdict, inverted_gate_verdict, grader_run_ms_p99 per type.

Knobs as a tenant sets them: n_epochs 2, learning_rate_multiplier 20000 (rate 0.2: the default 1e-5 suits real
models, a random tiny one needs a large step), compute_multiplier 2 (8 completions per prompt),
batch_size 2, and the platform's `max_completion_tokens` 8 (the target is 8 words; a random tiny model
never writes its end-of-sequence token, so every sample costs the whole budget, and reasoning_effort's
budgets, 128 tokens and up, made a CPU run take hours); the gate's completion budget is its
`reward_max_new_tokens` setting, also 8, capped by the job's own.

    python bench/rft.py [--prompts 40] [--held-out 16] [--epochs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from whole_platform import RunningPlatform, jsonl, running_platform

TARGET = " ".join(["the"] * 8)
# the latency bounds; multi (two text_similarity graders and a formula) is reported without one
P99_BOUND_MS = {"string_check": 50, "text_similarity": 50, "python": 500}
CALLS_PER_S = 40   # grader calls paced below the gateway's default per-key rate
PARTS = {"close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
                   "reference": "{{item.target}}", "evaluation_metric": "fuzzy_match"},
         "words": {"type": "text_similarity", "name": "words", "input": "{{sample.output_text}}",
                   "reference": "{{item.target}}", "evaluation_metric": "rouge_1"}}
GRADER = {"type": "multi", "name": "reward", "calculate_output": "0.8 * close + 0.2 * words", "graders": PARTS}
INVERTED = {"type": "multi", "name": "inverted", "calculate_output": "1 - (0.8 * close + 0.2 * words)",
            "graders": PARTS}
TERMINAL = ("succeeded", "failed", "cancelled")


def rows(numbers: range) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Tell me about the number {i}."}], "target": TARGET}
            for i in numbers]


def eval_config(args: argparse.Namespace) -> dict:
    """The gate: the reward stage on the held-out prompts (greedy, `max_new_tokens` each), safety as always;
    the benchmark suites and the pairwise judge say nothing about a random tiny model, so they are off."""
    return {"stages": {"holdout": {"min_reward_gain": args.margin, "reward_max_new_tokens": args.max_new_tokens,
                                   "max_rows": args.held_out}, "benchmarks": False, "judge": False}}


async def poll(fetch, done, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}: {value}")
        await asyncio.sleep(1.0)


async def upload(client, name: str, data: bytes) -> str:
    f = await client.files.create(file=(name, data), purpose="fine-tune")
    f = await poll(lambda: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 300, f"validation of {name}")
    if f.status != "processed":
        sys.exit(f"{name} not accepted: {f.status} {f.model_extra}")
    return f.id


async def create_job(client, train: str, held_out: str, grader: dict, args: argparse.Namespace, suffix: str):
    return await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=train, validation_file=held_out, seed=0, suffix=suffix,
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
            "n_epochs": args.epochs, "batch_size": args.batch_size, "compute_multiplier": args.generations / 4,
            "learning_rate_multiplier": args.learning_rate_multiplier, "eval_interval": args.eval_interval,
            "max_completion_tokens": args.max_new_tokens}}},
        extra_body={"eval_config": eval_config(args)})


async def finished(client, job_id: str, timeout_s: float) -> dict:
    """The job once terminal, with its registered model (lineage included) and its last step."""
    seen: list[str] = []

    def done(j) -> bool:
        if not seen or seen[-1] != j.status:
            seen.append(j.status)
            print(f"  {job_id}: {j.status}", flush=True)
        return j.status in TERMINAL

    job = await poll(lambda: client.fine_tuning.jobs.retrieve(job_id), done, timeout_s, f"job {job_id}")
    if job.status != "succeeded":
        sys.exit(f"job {job_id} {job.status}: {job.error}")
    models = await poll(lambda: client.models.list(extra_query={"job_id": job_id}), lambda page: page.data, 120,
                        f"the model of {job_id}")
    model = (await client.models.retrieve(models.data[0].id)).model_extra
    checkpoints = await client.fine_tuning.jobs.checkpoints.list(job_id)
    return {"job": job, "model": model, "steps": max((c.step_number for c in checkpoints.data), default=0)}


def reward_stage(stages: list[dict]) -> tuple[str, float, float, str]:
    """(status, base, candidate, reason) of the gate's reward stage."""
    holdout = next(s for s in stages if s["name"] == "holdout")
    metric = next(m for m in holdout["metrics"] if m["name"] == "holdout_reward")
    return holdout["status"], metric["base"], metric["candidate"], holdout["reason"]


async def judge_under_real_grader(p: RunningPlatform, graded: dict, planted: dict, args) -> dict:
    """The planted model's adapter through the graded job's gate (its grader and held-out prompts)."""
    from whetstone.contracts import EvalRequestedV1
    from whetstone.contracts.enums import EvalReason

    lineage = graded["model"]["lineage"]
    answer = await p.eval_request(EvalRequestedV1(
        request_id=f"bench-rft-{uuid.uuid4().hex[:12]}", job_id=graded["job"].id,
        model_id=planted["model"]["model_id"], checkpoint_uri=planted["model"]["artifact_uri"],
        manifest_sha256=planted["model"]["artifact_sha256"], base_model="tiny-llama",
        base_model_sha256=lineage["base_model_sha256"], reason=EvalReason.MANUAL, eval_config=eval_config(args)),
        timeout_s=900)
    stages = [s.model_dump(mode="json") for s in answer.stages]
    status, base, candidate, reason = reward_stage(stages)
    return {"verdict": str(answer.verdict), "reward_stage": status, "base": base, "candidate": candidate,
            "reason": reason}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def grader_latency(client) -> dict[str, float]:
    """p99 of `graders.run` through the gateway, per type (3 warm-up calls each are not counted).
    Calls start at most CALLS_PER_S a second, under the gateway's default per-key rate (50/s): a
    call refused 429 would be retried by the client after its Retry-After, which times the edge's
    rate limit, not the grader."""
    import graders as samples  # bench/graders.py

    sample = json.dumps({"answer": "Paris", "explanation": samples.ANSWER})
    counts = {"string_check": 100, "text_similarity": 100, "multi": 100, "python": 30}
    out = {}
    for kind, defs in samples.graders().items():
        took, began = [], 0.0
        for i in range(counts[kind] + 3):
            await asyncio.sleep(max(0.0, began + 1 / CALLS_PER_S - time.perf_counter()))
            began = time.perf_counter()
            result = await client.fine_tuning.alpha.graders.run(grader=defs[i % len(defs)], model_sample=sample,
                                                                item=samples.ITEM)
            if i >= 3:
                took.append((time.perf_counter() - began) * 1000)
            errors = result.metadata.errors.model_dump(exclude_none=True)
            if any(v for v in errors.values() if v is not None and v is not False):
                sys.exit(f"{kind} grader erred: {errors}")
        out[kind] = round(percentile(took, 99), 2)
        print(f"graders.run {kind:16s} n={len(took)} p50 {statistics.median(took):7.2f} ms  p99 {out[kind]:7.2f} ms",
              flush=True)
    return out


async def run(args: argparse.Namespace, root: Path) -> dict:
    began = time.perf_counter()
    async with running_platform(root) as p:
        print(f"platform up after {time.perf_counter() - began:.0f} s", flush=True)
        c = p.client
        train = await upload(c, "rft-train.jsonl", jsonl(rows(range(args.prompts))))
        held_out = await upload(c, "rft-held-out.jsonl", jsonl(rows(range(1000, 1000 + args.held_out))))
        graded_job = await create_job(c, train, held_out, GRADER, args, "graded")
        planted_job = await create_job(c, train, held_out, INVERTED, args, "inverted")
        print(f"jobs {graded_job.id} (grader) and {planted_job.id} (inverted grader) created", flush=True)
        graded = await finished(c, graded_job.id, args.timeout)
        status, reward_base, reward_candidate, reason = reward_stage(graded["model"]["lineage"]["eval_stages"])
        verdict = graded["model"]["lineage"]["eval_verdict"]
        print(f"graded job: {graded['steps']} steps; gate {verdict} (model {graded['model']['stage']}); reward stage "
              f"{status}: {reason}", flush=True)
        planted = await finished(c, planted_job.id, args.timeout)
        own = reward_stage(planted["model"]["lineage"]["eval_stages"])
        print(f"inverted job: {planted['steps']} steps; its own gate (inverted grader) "
              f"{planted['model']['lineage']['eval_verdict']}: {own[3]}", flush=True)
        judged = await judge_under_real_grader(p, graded, planted, args)
        print(f"inverted job's adapter under the real grader: gate {judged['verdict']}: {judged['reason']}",
              flush=True)
        latency = await grader_latency(c)
    return {
        "reward_base": round(reward_base, 4), "reward_candidate": round(reward_candidate, 4),
        "reward_inverted_candidate": round(judged["candidate"], 4), "steps": graded["steps"],
        "wall_s": round(time.perf_counter() - began, 1), "gate_verdict": verdict,
        "inverted_gate_verdict": judged["verdict"], "inverted_own_gate_verdict": planted["model"]["lineage"]["eval_verdict"],
        "grader": "multi: 0.8 fuzzy_match + 0.2 rouge_1 vs item.target", "grader_run_ms_p99": latency,
        "jobs": [graded_job.id, planted_job.id],
        "targets_met": {"gain_0.25": reward_candidate >= reward_base + 0.25, "gate": verdict == "passed",
                        "inverted": judged["verdict"] == "failed",
                        "p99": all(latency[k] <= bound for k, bound in P99_BOUND_MS.items())}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2, help="prompts per optimiser step")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (compute_multiplier x 4)")
    p.add_argument("--learning-rate-multiplier", type=float, default=20_000.0,
                   help="x 1e-5 (default: rate 0.2, as a random tiny model needs; with 8-token completions, "
                        "rate 0.1 gained +0.19 in 1 epoch and +0.24 in 2, rate 0.2 +0.85 in 2)")
    p.add_argument("--eval-interval", type=int, default=1000,
                   help="steps between the trainer's validation passes (default: none within the 20 steps; "
                        "the gate grades the held-out prompts anyway)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="the completion budget in training and in the gate")
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    p.add_argument("--keep", type=Path, default=None, help="keep the platform's data here (default: a temp dir)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-rft-")) if args.keep is None else args.keep.resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(json.dumps(asyncio.run(run(args, root))))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
