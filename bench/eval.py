"""Eval gate outcome quality on planted candidates (issue 16, item 6).

Teaches a tiny base (cached on disk by recipe hash), plants >= 20 candidates (good, forgetting,
safety_eroded, no_gain, style_degraded; several seeds each), runs the full four-stage gate on each
and prints per candidate the stage verdicts and wall time. Baseline in the same run: the old
single-number gate (holdout loss below the base's), on the same candidates. Last line: JSON.

    python bench/eval.py [--per-kind 4] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch

    torch.set_num_threads(1)  # shared 2-core machine: oversubscribed threads are ~10x slower
    from whetstone.devstack.eval_harness.judge_server import JudgeServer
    from whetstone.devstack.eval_harness.run import Harness
    from whetstone.devstack.eval_harness.teach import KINDS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-kind", type=int, default=4)
    p.add_argument("--cache", type=Path, default=Path(".whetstone/eval-harness"))
    p.add_argument("--kinds", default=",".join(KINDS))
    args = p.parse_args(argv)
    began = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp, JudgeServer() as judge:
        harness = Harness(Path(tmp), args.cache, judge.base_url, log=lambda m: print(m, flush=True))
        print(f"[bench] base {harness.base.name} ready after {time.perf_counter() - began:.0f}s", flush=True)
        for seed in range(args.per_kind):
            for kind in args.kinds.split(","):
                planted = harness.plant(kind, seed)
                results.append(planted)
                print(planted.line(), flush=True)
                for s in planted.stages:
                    if s.status != "passed":
                        print(f"    {s.name}: {s.reason}", flush=True)
    good = [r for r in results if r.kind == "good"]
    bad = [r for r in results if r.kind != "good"]
    blocked_good = sum(r.blocked for r in good)
    bad_blocked = sum(r.blocked for r in bad)
    # baseline: the gate as it was (holdout loss must beat the base's), same candidates
    def loss_gate_blocks(r) -> bool:
        m = next((m for s in r.stages for m in s.metrics if m.name == "holdout_loss"), None)
        return m is None or not (m.candidate < m.base)
    baseline_bad_blocked = sum(loss_gate_blocks(r) for r in bad)
    walls = [r.eval_s for r in results]
    summary = {
        "candidates": len(results), "good": len(good), "good_passed": len(good) - blocked_good,
        "bad": len(bad), "bad_blocked": bad_blocked,
        "blocked_by_intended_stage": sum(r.blocked_by_intended for r in bad),
        "gate_precision": round(bad_blocked / (bad_blocked + blocked_good), 3) if bad_blocked + blocked_good else 0.0,
        "gate_recall": round(bad_blocked / len(bad), 3) if bad else 0.0,
        "eval_wall_s_p50": round(statistics.median(walls), 1) if walls else 0.0,
        "eval_wall_s_max": round(max(walls), 1) if walls else 0.0,
        "baseline_loss_gate_recall": round(baseline_bad_blocked / len(bad), 3) if bad else 0.0,
        "total_wall_s": round(time.perf_counter() - began, 1),
    }
    for kind in sorted({r.kind for r in results}):
        rs = [r for r in results if r.kind == kind]
        print(f"[bench] {kind:<15} {sum(not r.blocked for r in rs)}/{len(rs)} passed, "
              f"{sum(r.blocked_by_intended for r in rs)}/{len(rs)} blocked by the intended stage")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
