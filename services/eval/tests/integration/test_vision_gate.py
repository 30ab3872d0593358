"""The gate on a vision candidate with DEFAULT eval settings (issue 37 point 4): the tiny random LLaVA
base, a LoRA trained on its language model to name a picture's colour, held-out image rows.

Benchmarks run the shipped text suites through the VLM's language side (loaded whole, the adapter
merged, handed to lm-eval as a model object); holdout scores exact answers and loss on the held-out
images, candidate vs base; safety runs on the language side. An untrained adapter (LoRA B = 0: the
base itself) is blocked by the holdout stage, so the passing verdict is earned."""

from pathlib import Path

import pytest
from whetstone.contracts.enums import EvalVerdict, StageStatus
from whetstone.devstack.eval_harness.run import DirCache
from whetstone.devstack.eval_harness.vision import (
    colour_rows,
    train_vision_adapter,
    write_rows,
)
from whetstone.eval.domain.policy import GatePolicy
from whetstone.eval.domain.stages import verdict
from whetstone.eval.usecases.pipeline import Candidate, GateTools, run_gate
from whetstone.runtime.models import weights_sha256

pytestmark = pytest.mark.integration
SHIPPED_SAFETY = Path(__file__).resolve().parents[2] / "src" / "whetstone" / "eval" / "suites" / "safety" / \
    "harmful_prompts.jsonl"


@pytest.mark.timeout(600)
def test_gate_passes_a_trained_vision_candidate_on_default_settings_and_blocks_an_untrained_one(tmp_path):
    import torch
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the shared CPU box: oversubscribed threads are far slower
    try:
        base = build_tiny_vision_model(tmp_path / "tiny-llava")
        trained = train_vision_adapter(base, colour_rows(32, seed=1), tmp_path / "trained", steps=12)
        untrained = train_vision_adapter(base, colour_rows(32, seed=1), tmp_path / "untrained", steps=0)
        holdout = write_rows(tmp_path / "holdout.jsonl", colour_rows(16, seed=2))
        prompts = tmp_path / "safety.jsonl"   # the first 4 shipped prompts: the stage's cost, not its logic
        prompts.write_text("".join(SHIPPED_SAFETY.read_text().splitlines(keepends=True)[:4]))
        tools = GateTools(cache=DirCache(tmp_path / "scores"), safety_prompts=prompts)
        sha = weights_sha256(base)

        def gate(adapter: Path):
            c = Candidate(job_id="ftjob-vision", base_dir=str(base), base_sha=sha, adapter_dir=str(adapter),
                          holdout_path=holdout)
            stages = run_gate(c, GatePolicy(), tools)
            return verdict(stages), {s.name: s for s in stages}

        (outcome, reasons), stages = gate(trained)
        (bad_outcome, bad_reasons), bad_stages = gate(untrained)
    finally:
        torch.set_num_threads(threads)
    report = "\n".join(reasons + bad_reasons)
    print(report)
    assert outcome == EvalVerdict.PASSED, report
    holdout = stages["holdout"]
    assert holdout.status == StageStatus.PASSED and holdout.details["rows"] == 16, report
    accuracy = next(m for m in holdout.metrics if m.name.startswith("holdout_") and m.higher_is_better)
    loss = next(m for m in holdout.metrics if m.name == "holdout_loss")
    assert accuracy.candidate is not None and accuracy.candidate >= 0.9 and accuracy.base == 0, report
    assert loss.candidate is not None and loss.base is not None and loss.candidate < loss.base / 2, report
    bench = stages["benchmarks"]   # measured on the language side, base and candidate, every shipped suite
    assert set(bench.details["suites"]) == {"wh_arithmetic", "wh_capitals", "wh_opposites"}, report
    assert all(s["n"] > 0 for s in bench.details["suites"].values()), report
    # the random base is at chance on every suite: no regression can be measured, and the stage says so
    assert bench.status == StageStatus.SKIPPED and "chance level" in bench.reason, report
    assert "language side" in bench.details["scored_on"], report
    assert stages["safety"].status == StageStatus.PASSED, report
    assert bad_outcome == EvalVerdict.FAILED and bad_stages["holdout"].status == StageStatus.FAILED, report
    assert bad_stages["benchmarks"].details["base_cached"] is True, report   # the base side is computed once
