"""Reinforcement fine-tuning on this CPU, with the recipe the trainer agent runs.

Task: answer any prompt with the row's `target` ("the the the the the the the the"). Grader: a
multi grader, 0.8 x `fuzzy_match` + 0.2 x `rouge_1` between `{{sample.output_text}}` and
`{{item.target}}`. Why it has reward variance from the first step: fuzzy_match is a continuous
character-level score, so the completions a random tiny model samples for one prompt already differ
in reward (a binary check would give most groups zero variance, hence zero advantage and no
gradient); rouge_1 pays for the word itself once the model produces it. What the tiny model learns
in 20 steps (measured 2026-11-28): a near miss character by character, greedy " Athe Athe Athe ..."
(fuzzy_match ~0.87, rouge_1 0): held-out reward 0.1648 -> 0.6986. The exact word (" the", one
token, reward 0.99) is rarely sampled from a random model, so the weight is on the continuous part,
where the policy moves within a few CPU minutes. With 0.5/0.5 weights and learning rate 0.1 the
same 20 steps settled on " to to to ..." (fuzzy_match 0.55, held-out reward 0.276).

Steps: a tiny random Llama (cached on disk) -> base reward on held-out prompts (greedy completions,
graded) -> GRPO + LoRA with the grader as reward (`recipes/grpo.py` in a child process, as the agent
launches it) -> candidate reward on the same held-out prompts -> `reward_gate` (margin 0.05). Then
a planted candidate trained against the inverted reward (-grader) is judged by the same gate under
the real grader, as a job whose reward was wrong would be. Last line JSON: reward_base,
reward_candidate, steps, wall_s, gate_verdict, inverted_gate_verdict, grader_run_ms_p99.

Not the whole platform: the job is run by the recipe harness (no upload, scheduler or agent);
tests/integration/test_rft_end_to_end.py is the path through the services.

    python bench/rft.py [--prompts 48] [--epochs 2] [--cache DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

GRADER = {"type": "multi", "name": "reward", "calculate_output": "0.8 * close + 0.2 * words", "graders": {
    "close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
              "reference": "{{item.target}}", "evaluation_metric": "fuzzy_match"},
    "words": {"type": "text_similarity", "name": "words", "input": "{{sample.output_text}}",
              "reference": "{{item.target}}", "evaluation_metric": "rouge_1"}}}
TARGET = " ".join(["the"] * 8)


def rows(numbers: range) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Tell me about the number {i}."}], "target": TARGET}
            for i in numbers]


def held_out_reward(base: Path, adapter: Path | None, prompts: list[dict], max_new_tokens: int) -> float:
    from whetstone.graders import GraderEnvironment, parse_grader
    from whetstone.modelkit.loading import load_model, load_tokenizer
    from whetstone.trainer_agent.recipes.rewards import (
        GraderReward,
        mean_reward,
        prompt_rows,
    )

    tokenizer = load_tokenizer(base)
    model = load_model(base)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    reward = GraderReward(parse_grader(GRADER), GraderEnvironment())   # the job's real grader, sign +1
    try:
        return mean_reward(model, tokenizer, prompt_rows(list(enumerate(prompts))), reward,
                           max_new_tokens=max_new_tokens).reward
    finally:
        reward.close()


def train(base: Path, work: Path, train_rows: list[dict], args, reward_sign: float) -> tuple[Path, int, list[float]]:
    from whetstone.devstack.recipe_harness import run_subprocess, write_jsonl
    from whetstone.graders.rft import parse_method
    from whetstone.trainer_agent.domain.recipe_io import Checkpoint, Progress

    plan = parse_method({"grader": GRADER, "hyperparameters": {
        "n_epochs": args.epochs, "batch_size": args.batch_size, "compute_multiplier": args.generations / 4,
        "reasoning_effort": "low"}}).record()
    # the platform's default learning rate (1e-5) suits real models; a random tiny one needs a large step
    plan.update(max_completion_tokens=args.max_new_tokens, learning_rate=args.learning_rate, reward_sign=reward_sign)
    job = f"bench-rft-{'inverted' if reward_sign < 0 else 'graded'}"
    config = {"job_id": job, "base_model": str(base),
              "train_file": str(write_jsonl(train_rows, work / f"{job}.jsonl")), "output_dir": str(work / job),
              "method": "reinforcement", "reinforcement": plan,
              "hyperparameters": {"seed": 0, "checkpoint_every_steps": 10_000, "max_seq_len": 128,
                                  "warmup_ratio": 0.0}}
    run = run_subprocess(config, work, timeout_s=3600)
    if run.returncode != 0:
        sys.exit(f"{job} failed: {run.last} (stderr: {work / (job + '.stderr.txt')})")
    rewards = [e.reward for e in run.of(Progress)]
    final = run.of(Checkpoint)[-1].path
    return final, run.completed.step, rewards


def grader_latency() -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).parent))
    import graders as latency  # bench/graders.py

    out = asyncio.run(latency.measure({"string_check": 100, "text_similarity": 100, "multi": 100, "python": 30},
                                      json.dumps({"answer": "Paris", "explanation": latency.ANSWER})))
    return {k: round(v["http_p99"], 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    from whetstone.graders.rft import reward_gate
    from whetstone.modelkit.tiny import build_tiny_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=2, help="prompts per optimiser step")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=0.1,
                   help="LoRA learning rate (default 0.1: a random tiny model needs a large step; 5e-2 gained "
                        "half as much in the same 20 steps)")
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--cache", type=Path, default=Path(".whetstone/bench-rft"))
    args = p.parse_args(argv)

    began = time.perf_counter()
    work = args.cache.resolve()
    base = work / "tiny-llama"
    if not (base / "config.json").is_file():
        build_tiny_model(base, seed=0)
    train_rows, held_out = rows(range(args.prompts)), rows(range(1000, 1000 + args.held_out))
    reward_base = held_out_reward(base, None, held_out, args.max_new_tokens)
    print(f"base reward on {len(held_out)} held-out prompts: {reward_base:.4f}", flush=True)

    trained_at = time.perf_counter()
    adapter, steps, curve = train(base, work, train_rows, args, reward_sign=1.0)
    train_s = time.perf_counter() - trained_at
    reward_candidate = held_out_reward(base, adapter, held_out, args.max_new_tokens)
    gate = reward_gate(reward_base, reward_candidate, args.margin)
    print(f"candidate: {steps} steps in {train_s:.0f} s, train reward {curve[0]:.3f} -> {curve[-1]:.3f}; "
          f"held-out {reward_candidate:.4f}; gate {gate.verdict}: {gate.reason}", flush=True)

    inverted_adapter, inverted_steps, inverted_curve = train(base, work, train_rows, args, reward_sign=-1.0)
    reward_inverted = held_out_reward(base, inverted_adapter, held_out, args.max_new_tokens)
    inverted = reward_gate(reward_base, reward_inverted, args.margin)
    print(f"inverted-reward candidate: {inverted_steps} steps, held-out {reward_inverted:.4f}; "
          f"gate {inverted.verdict}: {inverted.reason}", flush=True)

    latency = grader_latency()
    print(json.dumps({
        "reward_base": round(reward_base, 4), "reward_candidate": round(reward_candidate, 4),
        "reward_inverted_candidate": round(reward_inverted, 4), "steps": steps, "train_s": round(train_s, 1),
        "wall_s": round(time.perf_counter() - began, 1), "gate_verdict": gate.verdict,
        "inverted_gate_verdict": inverted.verdict, "grader": "multi: 0.8 fuzzy_match + 0.2 rouge_1 vs item.target",
        "train_reward_first_last": [round(curve[0], 4), round(curve[-1], 4)], "grader_run_ms_p99": latency,
        "targets_met": {"gain_0.25": reward_candidate >= reward_base + 0.25, "gate": gate.verdict == "passed",
                        "inverted": inverted.verdict == "failed"}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
