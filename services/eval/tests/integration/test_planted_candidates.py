"""Outcome quality: a taught tiny base and one planted candidate of each kind.
The gate must pass the good one and block each bad one on the stage meant to catch it.
The taught base is cached under .whetstone/eval-harness by recipe hash (shared with `make bench-eval`);
the full >= 20 candidate run lives in bench/eval.py."""

import os
from pathlib import Path

import pytest
from whetstone.devstack.eval_harness.judge_server import JudgeServer
from whetstone.devstack.eval_harness.run import Harness
from whetstone.devstack.eval_harness.teach import INTENDED_STAGE, KINDS

pytestmark = pytest.mark.integration
CACHE = Path(os.environ.get("WHETSTONE_EVAL_HARNESS_CACHE", Path(__file__).resolve().parents[4] / ".whetstone" / "eval-harness"))


# about 3 minutes on an idle 2-core box (base cached); the limit is for a box shared with other jobs
@pytest.mark.timeout(1500)
def test_gate_passes_the_good_candidate_and_blocks_each_bad_kind_on_its_stage(tmp_path):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CPU box: oversubscribed threads are far slower
    try:
        with JudgeServer() as judge:
            harness = Harness(tmp_path, CACHE, judge.base_url, log=print)
            results = {kind: harness.plant(kind, seed=0) for kind in KINDS}
    finally:
        torch.set_num_threads(threads)
    report = "\n".join(r.line() + "".join(f"\n    {s.name}: {s.reason}" for s in r.stages if s.status != "passed")
                       for r in results.values())
    good = results["good"]
    assert good.verdict == "passed", report
    assert {s.name: s.status for s in good.stages} == {"benchmarks": "passed", "holdout": "passed",
                                                        "safety": "passed", "judge": "passed"}, report
    for kind, stage in INTENDED_STAGE.items():
        assert results[kind].blocked, report
        assert results[kind].blocked_by_intended, f"{kind} should be blocked by {stage}\n{report}"
