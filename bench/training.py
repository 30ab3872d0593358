"""Training benchmark: packing vs padding, checkpoint overhead, SIGTERM to a durable
checkpoint, resume exactness - on the tiny CPU Llama, all measured in this run.

1. generate chat SFT data with a long-tailed length distribution (log-normal answer
   lengths: most replies short, a few very long, as in real chat SFT sets);
2. train the same LoRA job on the same data twice per mode, alternating: padded batches
   (right-padded to the longest example of each micro-batch, stock sdpa with a mask) and
   packed batches (padding-free: one row per micro-batch, positions reset per example,
   per-example attention). Figures: fraction of computed tokens that are real, real
   tokens per second of training (best of the runs of each mode) and per CPU second of this
   process (the figure neighbours' load moves least on a shared box), with the default
   checkpoint cadence (every 50 steps or 30 minutes) - whose cost is the checkpoint
   overhead fraction (checkpoint writing time / training time, packed run); then a profile of
   both paths on the same micro-batches, alternating: CPU seconds per phase (collate, forward,
   backward, optimizer) and the costliest torch ops of each. Every run uses `--threads` torch
   threads (default 1: on this shared 2-core box two OpenMP threads per op waited on each other
   at every small op and made both paths ~10x slower, packed - more, smaller ops - the most);
3. SIGTERM a running recipe process (a real child, as the agent runs it) and time until
   its emergency checkpoint is fully written AND uploaded to S3 (embedded SeaweedFS,
   manifest last, `whetstone.runtime.checkpoints.upload_checkpoint`);
4. resume exactness: the job interrupted by SIGTERM at random training forward passes
   (incl. between gradient-accumulation micro-steps and at an epoch boundary), resumed from
   each emergency checkpoint, vs uninterrupted: per-step losses and final adapter equal
   bit for bit;
5. "auto" against today's fixed defaults: for the demo data (240 rows of
   examples/datasets/make_chat_demo.py) and a file 10x larger, the hyperparameters admission
   resolves (scheduler domain/auto.py, on a CPU shape) and today's defaults (n_epochs 3, batch 8,
   LoRA rank 16, lr 2e-4) each train the same LoRA; holdout loss on 60 unseen rows (and the
   untrained base's, to show how much training moved it). "Worse" has to beat run-to-run noise:
   the defaults also train with a second seed, and auto counts as worse when its loss exceeds the
   defaults' by more than twice that seed spread. The three runs of a file (defaults, defaults with the
   second seed, auto) train at once, each a recipe child process with `--threads` threads.

    .venv/bin/python bench/training.py [--quick] [--rows N] [--seed S] [--keep DIR] [--only-auto] [--only-packing] [--threads N] [--sizes N ...]

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from whetstone.devstack.recipe_harness import (
    interrupted_chain,
    run_in_process,
    run_subprocess,
    write_jsonl,
)
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    ChildEvent,
    Preempted,
    TrainingConfig,
)

WORDS = ("the river mountain forest cloud stone paper garden window music yellow purple apple banana cherry "
         "model data training answer question capital city country water sun east west help please thank "
         "step think explain result correct short poem sentence translate summarize journey thousand miles").split()
TOPICS = ["Explain", "Summarize", "Describe", "Tell me about", "Write a short note on", "What is"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ data


def long_tailed_rows(n: int, seed: int) -> list[dict]:
    """Chat rows whose answer lengths follow a log-normal (median ~35 words, long right tail)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        answer_words = min(700, max(3, int(rng.lognormvariate(math.log(35), 1.0))))
        question = f"{rng.choice(TOPICS)} the {rng.choice(WORDS)} and the {rng.choice(WORDS)}?"
        answer = " ".join(rng.choice(WORDS) for _ in range(answer_words)) + "."
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if rng.random() < 0.3:
            messages.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        rows.append({"messages": messages})
    return rows


def length_stats(base: Path, data: Path, max_seq_len: int) -> dict:
    from whetstone.modelkit.loading import load_tokenizer
    from whetstone.trainer_agent.recipes.data import read_chat_jsonl, tokenize_chat_rows

    examples = tokenize_chat_rows(load_tokenizer(base), read_chat_jsonl(data), max_seq_len, data.name)
    lengths = sorted(len(e.input_ids) for e in examples)
    pick = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
    return {"examples": len(lengths), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": lengths[-1],
            "mean": round(statistics.mean(lengths), 1)}


# ------------------------------------------------------------------ 2. packed vs padded


def training_config(job_id: str, base: Path, data: Path, out: Path, **hyperparameters) -> TrainingConfig:
    # default cadence: checkpoint every 50 steps or 30 minutes, whichever first
    hp = {"n_epochs": 2, "learning_rate": 2e-4, "batch_size": 8, "gradient_accumulation_steps": 1, "lora_r": 8,
          "lora_alpha": 16, "lora_dropout": 0.05, "max_seq_len": 1024, "seed": 42, "warmup_ratio": 0.03,
          "checkpoint_every_steps": 50, "checkpoint_every_minutes": 30}
    return TrainingConfig(job_id=job_id, base_model=str(base), train_file=data, output_dir=out, method="lora",
                          hyperparameters={**hp, **hyperparameters})


def packed_vs_padded(base: Path, data: Path, work: Path, repeats: int, rows: int) -> dict:
    # enough epochs for 100 optimizer steps: the default cadence (50 steps) writes 2 checkpoints
    epochs = math.ceil(100 * 8 / rows)
    results: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(repeats):
        for packing in (False, True):
            name = f"{'packed' if packing else 'padded'}-{i}"
            config = training_config(name, base, data, work / name, packing=packing, n_epochs=epochs)
            cpu_started = time.process_time()
            run = run_in_process(config, work)
            cpu_s = time.process_time() - cpu_started   # the whole run: loading and saving too
            if run.returncode != 0:
                raise SystemExit(f"{name} failed: {run.last}")
            done = run.completed
            result = {"tokens": done.tokens, "train_s": done.train_runtime_s, "cpu_s": cpu_s,
                      "tokens_per_cpu_s": done.tokens / cpu_s,
                      "tokens_per_s": done.tokens / done.train_runtime_s,
                      "non_padding_fraction": done.outcome.non_padding_fraction, "checkpoint_s": done.checkpoint_s,
                      "checkpoints": sum(1 for c in run.of(Checkpoint) if c.kind == "periodic"),
                      "steps": done.step, "train_loss": done.train_loss}
            results[packing].append(result)
            log(f"  {name}: {result['tokens']} real tokens in {result['train_s']:.1f}s = "
                f"{result['tokens_per_s']:.0f} tokens/s ({result['tokens_per_cpu_s']:.0f} per CPU second), non-padding {result['non_padding_fraction']:.3f}, "
                f"{result['checkpoints']} checkpoints in {result['checkpoint_s']:.3f}s, "
                f"train loss {result['train_loss']:.4f}")
            shutil.rmtree(work / name, ignore_errors=True)
    best = {mode: max(runs, key=lambda r: r["tokens_per_s"]) for mode, runs in results.items()}
    best_cpu = {mode: max(runs, key=lambda r: r["tokens_per_cpu_s"]) for mode, runs in results.items()}
    packed = best[True]
    return {
        "non_padding_fraction_packed": round(packed["non_padding_fraction"], 4),
        "non_padding_fraction_padded": round(best[False]["non_padding_fraction"], 4),
        "tokens_per_s_packed": round(packed["tokens_per_s"], 1),
        "tokens_per_s_padded": round(best[False]["tokens_per_s"], 1),
        "packed_speedup": round(packed["tokens_per_s"] / best[False]["tokens_per_s"], 3),
        # the speedup were a step's cost proportional to the tokens it computes: 1 / padded's non-padding fraction
        "packed_speedup_limit": round(1 / best[False]["non_padding_fraction"], 3),
        "packed_fraction_of_limit": round(packed["tokens_per_s"] / best[False]["tokens_per_s"]
                                          * best[False]["non_padding_fraction"], 3),
        # per CPU second of this process (wall-clock rates on a shared box follow the neighbours' load)
        "packed_speedup_cpu": round(best_cpu[True]["tokens_per_cpu_s"] / best_cpu[False]["tokens_per_cpu_s"], 3),
        "packed_fraction_of_limit_cpu": round(best_cpu[True]["tokens_per_cpu_s"] / best_cpu[False]["tokens_per_cpu_s"]
                                              * best[False]["non_padding_fraction"], 3),
        "checkpoint_overhead_fraction": round(packed["checkpoint_s"] / packed["train_s"], 5),
        "checkpoints_at_default_cadence": packed["checkpoints"],
        "seconds_per_checkpoint": round(packed["checkpoint_s"] / max(packed["checkpoints"], 1), 4),
        "optimizer_steps": packed["steps"],
        "train_loss_packed_vs_padded": [round(packed["train_loss"], 5), round(best[False]["train_loss"], 5)],
    }


def phase_profile(base: Path, data: Path, micro_batches: int, seed: int) -> dict:
    """Where each path spends its time: the same micro-batches of 8, trained alternately padded and packed
    (the recipe's collators and attention, LoRA r 8 as above), process CPU seconds per phase, and the
    torch ops that cost most in each path (torch.profiler, self CPU time)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM
    from whetstone.modelkit.loading import load_tokenizer
    from whetstone.trainer_agent.recipes import attention
    from whetstone.trainer_agent.recipes.data import (
        PaddedCollator,
        PaddingFreeCollator,
        read_chat_jsonl,
        tokenize_chat_rows,
    )

    tokenizer = load_tokenizer(base)
    rows = [e.as_row() for e in tokenize_chat_rows(tokenizer, read_chat_jsonl(data), 1024, data.name)]
    random.Random(seed).shuffle(rows)
    batches = [rows[i:i + 8] for i in range(0, 8 * micro_batches, 8)]

    def path(impl: str, collator) -> dict:
        torch.manual_seed(0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, attn_implementation=impl, dtype=torch.float32),
                               LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                          task_type="CAUSAL_LM")).train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
        return {"model": model, "optimizer": optimizer, "collator": collator,
                "seconds": dict.fromkeys(("collate", "forward", "backward", "optimizer"), 0.0)}

    paths = {"padded": path("sdpa", PaddedCollator(tokenizer.pad_token_id)),
             "packed": path(attention.register(), PaddingFreeCollator())}

    def step(p: dict, batch: list) -> None:
        clock = time.process_time
        t0 = clock()
        inputs = p["collator"](batch)
        inputs.pop("example_lines")
        t1 = clock()
        loss = p["model"](**inputs).loss
        t2 = clock()
        loss.backward()
        t3 = clock()
        p["optimizer"].step()
        p["optimizer"].zero_grad()
        t4 = clock()
        for phase, took in zip(p["seconds"], (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            p["seconds"][phase] += took

    top: dict[str, list] = {}
    for name, p in paths.items():   # the first micro-batch warms up, untimed
        step(p, batches[0])
        p["seconds"] = dict.fromkeys(p["seconds"], 0.0)
    for batch in batches:
        for p in paths.values():
            step(p, batch)
    for name, p in paths.items():   # op-level view of two micro-batches
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in batches[:2]:
                step(p, batch)
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:6]
        top[name] = [[e.key, e.count, round(e.self_cpu_time_total / 1e6, 3)] for e in ops]
    out: dict = {}
    for name, p in paths.items():
        seconds = {k: round(v, 3) for k, v in p["seconds"].items()}
        out[name] = {"cpu_s": seconds, "total_cpu_s": round(sum(seconds.values()), 3), "top_ops": top[name],
                     "non_padding_fraction": round(p["collator"].counter.non_padding_fraction, 4)}
        log(f"  profile {name}: cpu s {seconds} (total {out[name]['total_cpu_s']}), "
            f"non-padding {out[name]['non_padding_fraction']}; top ops (name, calls, self cpu s) {top[name]}")
    speedup = out["padded"]["total_cpu_s"] / out["packed"]["total_cpu_s"]
    limit = 1 / out["padded"]["non_padding_fraction"]
    log(f"  profile: packed {speedup:.3f}x padded per CPU second, limit {limit:.3f}x")
    return {"profile": out, "profile_packed_speedup_cpu": round(speedup, 3),
            "profile_packed_fraction_of_limit_cpu": round(speedup / limit, 3), "profile_micro_batches": micro_batches}


# ------------------------------------------------------------------ 3. SIGTERM -> durable checkpoint


def sigterm_to_durable(base: Path, data: Path, work: Path) -> dict:
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.runtime.checkpoints import upload_checkpoint
    from whetstone.runtime.s3 import ObjectStore

    bucket = "whetstone-bench"
    # S3 only: the Kafka and Postgres addresses are never used here
    stack = EmbeddedStack(work / "stack", kafka_bootstrap="127.0.0.1:1", database_url="postgresql://unused",
                          buckets=[bucket], log=log)
    endpoints = stack.start()
    try:
        store = ObjectStore(endpoints.s3_endpoint, endpoints.s3_access_key, endpoints.s3_secret_key, bucket)
        uploaded: dict = {}

        def on_event(event: ChildEvent) -> None:
            if isinstance(event, Checkpoint) and event.kind == "emergency":
                up = upload_checkpoint(store, event.path, f"bench/checkpoints/step-{event.step}",
                                       {"step": event.step, "kind": "emergency"})
                uploaded.update(at=time.time(), uri=up.uri, files=up.files, size_bytes=up.size_bytes)

        config = training_config("sigterm", base, data, work / "sigterm", checkpoint_every_steps=0)
        run = run_subprocess(config, work, sigterm_after_step=5, on_event=on_event)
        if run.names()[-1:] != ["preempted"] or "at" not in uploaded:
            raise SystemExit(f"SIGTERM run did not preempt cleanly: {run.names()[-3:]}\n{run.stderr[-2000:]}")
        preempted = run.of(Preempted)[-1]
        return {
            "sigterm_to_durable_checkpoint_s": round(uploaded["at"] - run.sigterm_sent_at, 3),
            "sigterm_to_local_checkpoint_s": preempted.sigterm_to_checkpoint_s,
            "emergency_checkpoint_step": preempted.step,
            "emergency_checkpoint_files": uploaded["files"],
            "emergency_checkpoint_bytes": uploaded["size_bytes"],
        }
    finally:
        stack.stop()


# ------------------------------------------------------------------ 4. resume exactness


def resume_exactness(base: Path, data: Path, work: Path, points: int, seed: int) -> dict:
    accumulation, micro, rows = 2, 2, 40
    steps_per_epoch = rows // (micro * accumulation)
    total_forwards = 2 * steps_per_epoch * accumulation
    rng = random.Random(seed)
    chosen = {steps_per_epoch * accumulation}  # the epoch boundary
    while len(chosen) < min(2, points):
        chosen.add(rng.randrange(1, total_forwards - 2, 2))  # between micro-steps
    while len(chosen) < points:
        candidate = rng.randrange(1, total_forwards - 2)
        if all(-(-candidate // accumulation) != -(-p // accumulation) for p in chosen):
            chosen.add(candidate)
    config = training_config("chain", base, data, work / "unused", n_epochs=2, batch_size=micro, max_seq_len=256,
                             gradient_accumulation_steps=accumulation, lora_dropout=0.1, learning_rate=5e-3,
                             checkpoint_every_steps=0, checkpoint_every_minutes=0, warmup_ratio=0.1)
    chain = interrupted_chain(config, work / "chain", sorted(chosen), accumulation)
    reference, chained = chain.reference.losses(), chain.chained_losses()
    differing = [s for s in reference if chained.get(s) != reference[s]]
    return {
        "resume_exact": chain.exact(),
        "interruption_forwards": sorted(chosen),
        "emergency_checkpoint_steps": chain.emergency_steps,
        "expected_checkpoint_steps": chain.expected_steps,
        "steps_compared": len(reference),
        "steps_differing": len(differing),
    }


# ------------------------------------------------------------------ 5. "auto" vs today's defaults


def auto_vs_default(base: Path, work: Path, seed: int, sizes: tuple[int, ...] = (240, 2400)) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "datasets"))
    from make_chat_demo import generate_rows
    from whetstone.contracts import Hyperparameters
    from whetstone.modelkit.holdout import holdout_loss
    from whetstone.modelkit.loading import load_model, load_tokenizer
    from whetstone.scheduler.domain import auto, resources
    from whetstone.scheduler.domain import jobs as rules
    from whetstone.scheduler.domain.hf_config import HfConfig
    from whetstone.trainer_agent.recipes.data import read_chat_jsonl, tokenize_chat_rows

    config = json.loads((base / "config.json").read_text())
    arch = resources.model_arch("tiny-llama", HfConfig.parse(config), sum(p.stat().st_size for p in base.glob("*.safetensors")))
    rows = generate_rows(60 + sum(sizes), seed)
    holdout = [r["messages"] for r in rows[:60]]
    tokenizer = load_tokenizer(base)
    default_hp, _ = rules.resolve_hyperparameters("lora", Hyperparameters(), rules.model_defaults(arch.max_positions))
    defaults = default_hp.model_dump(exclude_none=True)
    keep = ("n_epochs", "learning_rate", "batch_size", "gradient_accumulation_steps", "lora_r", "lora_alpha",
            "lora_dropout", "max_seq_len", "warmup_ratio", "gradient_checkpointing")

    def config_of(name: str, data: Path, hp: dict, run_seed: int) -> TrainingConfig:
        return training_config(name, base, data, work / name, **{k: hp[k] for k in keep if k in hp}, seed=run_seed,
                               checkpoint_every_steps=0, checkpoint_every_minutes=0)

    def losses_of(configs: list[TrainingConfig]) -> list[tuple[float, int]]:
        """Train the runs of one file at once, each a recipe child (as the agent runs it), then score each."""
        from concurrent.futures import ThreadPoolExecutor

        from peft import PeftModel

        with ThreadPoolExecutor(len(configs)) as pool:
            runs = list(pool.map(lambda cfg: run_subprocess(cfg, work, timeout_s=7200), configs))
        out = []
        for cfg, run in zip(configs, runs):
            if run.returncode != 0:
                raise SystemExit(f"{cfg.job_id} failed: {run.last}\n{run.stderr[-2000:]}")
            model = PeftModel.from_pretrained(load_model(base, dtype="float32"), run.of(Checkpoint)[-1].path).eval()
            out.append((holdout_loss(model, tokenizer, holdout, max_len=int(cfg.hyperparameters["max_seq_len"]))["loss"],
                        run.completed.step))
            shutil.rmtree(work / cfg.job_id, ignore_errors=True)
        return out

    base_loss = holdout_loss(load_model(base, dtype="float32").eval(), tokenizer, holdout,
                             max_len=int(defaults["max_seq_len"]))["loss"]
    log(f"  untrained base: holdout loss {base_loss:.4f}")
    out: dict = {"auto_runs": 0, "auto_worse_than_default": 0, "base_holdout_loss": round(base_loss, 5),
                 "auto_vs_default": {}}
    start = 60
    for size in sizes:
        data = write_jsonl(rows[start:start + size], work / f"auto-{size}.jsonl")
        start += size
        tokens = sum(len(e.input_ids) for e in tokenize_chat_rows(tokenizer, read_chat_jsonl(data), 2048, data.name))
        resolved = auto.resolve_auto("lora", Hyperparameters(), default_hp, arch, auto.DataFacts(size, tokens), 16.0, 1)
        assert not isinstance(resolved, rules.Rejection), resolved
        auto_hp, chosen = resolved[0].model_dump(exclude_none=True), resolved[1]
        log(f"  {size} rows: auto " + ", ".join(f"{k}={auto_hp[k]}" for k in chosen) +
            f"; defaults n_epochs={defaults['n_epochs']}, batch_size={defaults['batch_size']}, "
            f"lora_r={defaults['lora_r']}, learning_rate={defaults['learning_rate']}")
        (default_loss, default_steps), (noise_loss, _), (auto_loss, auto_steps) = losses_of(
            [config_of(f"default-{size}", data, defaults, 42), config_of(f"default-seed2-{size}", data, defaults, 43),
             config_of(f"auto-{size}", data, auto_hp, 42)])
        margin = 2 * abs(noise_loss - default_loss)
        worse = auto_loss > default_loss + margin
        log(f"  {size} rows: holdout loss auto {auto_loss:.4f} ({auto_steps} steps) vs defaults {default_loss:.4f} "
            f"({default_steps} steps; seed spread {abs(noise_loss - default_loss):.4f}) -> "
            f"{'WORSE' if worse else 'not worse'}")
        out["auto_runs"] += 1
        out["auto_worse_than_default"] += int(worse)
        out["auto_vs_default"][str(size)] = {
            "auto": {k: auto_hp[k] for k in chosen}, "auto_holdout_loss": round(auto_loss, 5),
            "default_holdout_loss": round(default_loss, 5), "default_seed_spread": round(abs(noise_loss - default_loss), 5),
            "auto_steps": auto_steps, "default_steps": default_steps}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, one run per mode, 2 interruptions")
    parser.add_argument("--rows", type=int, default=None, help="training rows (default 400, quick 160)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, default=None, help="keep the work directory here")
    parser.add_argument("--only-auto", action="store_true", help="only part 5: 'auto' against today's defaults")
    parser.add_argument("--only-packing", action="store_true", help="only part 2: packed against padded")
    parser.add_argument("--sizes", type=int, nargs="+", default=[240, 2400],
                        help="part 5's training file sizes in rows (default: the demo's 240 and 10x that)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for every run (default 1: on a shared box, OpenMP threads "
                             "waiting on each other at every small op cost more than the second core gives)")
    args = parser.parse_args(argv)
    rows = args.rows or (160 if args.quick else 400)
    work = args.keep or Path(tempfile.mkdtemp(prefix="whetstone-bench-training-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # the recipe children of part 5
    log(f"torch intra-op threads: {torch.get_num_threads()}")
    try:
        from whetstone.modelkit.tiny import build_tiny_model

        base = build_tiny_model(work / "tiny-llama", seed=0)
        if args.only_auto:
            figures = auto_vs_default(base, work, args.seed, tuple(args.sizes))
            figures["threads"] = args.threads
            figures["bench_wall_s"] = round(time.perf_counter() - started, 1)
            log(f"target auto_worse_than_default == 0: {'met' if figures['auto_worse_than_default'] == 0 else 'MISSED'}")
            print(json.dumps(figures))
            return 0
        data = write_jsonl(long_tailed_rows(rows, args.seed), work / "train.jsonl")
        lengths = length_stats(base, data, 1024)
        log(f"data: {rows} chat rows, tokens per example {lengths}")
        log("warm-up run")
        run_in_process(training_config("warmup", base, data, work / "warmup", n_epochs=1, checkpoint_every_steps=0),
                       work)
        log("packed vs padded (default checkpoint cadence)")
        figures = packed_vs_padded(base, data, work, repeats=1 if args.quick else 2, rows=rows)
        log("profile: where each path spends its time (same micro-batches, alternating)")
        figures.update(phase_profile(base, data, micro_batches=10 if args.quick else 20, seed=args.seed))
        figures["threads"] = args.threads
        if args.only_packing:
            figures.update(rows=rows, example_tokens=lengths, bench_wall_s=round(time.perf_counter() - started, 1))
            print(json.dumps(figures))
            return 0
        log("SIGTERM -> durable checkpoint in S3")
        figures.update(sigterm_to_durable(base, data, work))
        log("resume exactness")
        chain_data = write_jsonl(long_tailed_rows(40, args.seed + 1), work / "chain.jsonl")
        figures.update(resume_exactness(base, chain_data, work, points=2 if args.quick else 5, seed=args.seed))
        log("'auto' against today's defaults")
        figures.update(auto_vs_default(base, work, args.seed, tuple(args.sizes)))
        figures.update(rows=rows, example_tokens=lengths, quick=args.quick,
                       bench_wall_s=round(time.perf_counter() - started, 1))
        for key, value in figures.items():
            log(f"{key}: {value}")
        targets = {
            "non_padding_fraction_packed >= 0.98": figures["non_padding_fraction_packed"] >= 0.98,
            "packed >= 1.4x padded tokens/s": figures["packed_speedup"] >= 1.4,
            "packed_fraction_of_limit >= 0.9": figures["packed_fraction_of_limit"] >= 0.9,
            "checkpoint_overhead_fraction <= 0.05": (figures["checkpoint_overhead_fraction"] <= 0.05
                                                     and figures["checkpoints_at_default_cadence"] >= 1),
            "sigterm_to_durable_checkpoint_s <= 25": figures["sigterm_to_durable_checkpoint_s"] <= 25,
            "resume_exact": figures["resume_exact"],
            "auto_worse_than_default == 0": figures["auto_worse_than_default"] == 0,
        }
        for name, ok in targets.items():
            log(f"target {name}: {'met' if ok else 'MISSED'}")
        print(json.dumps(figures))
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
