import argparse

import pytest

from whetstone.cli.follow import LossCurve, eta_text
from whetstone.cli.public import job_body

pytestmark = pytest.mark.unit


def args(**kw) -> argparse.Namespace:
    base = {"model": "tiny-llama", "training_file": "ds-1", "method": "supervised", "epochs": None,
            "learning_rate": None, "batch_size": None, "hp": None, "validation_file": None, "suffix": None, "seed": None}
    return argparse.Namespace(**{**base, **kw})


def test_job_body_is_openai_shaped_with_the_platform_method_as_extension():
    assert job_body(args()) == {"model": "tiny-llama", "training_file": "ds-1", "method": {"type": "supervised"}}
    body = job_body(args(method="qlora", epochs=2, hp=["lora_r=8", "note=x"], seed=3))
    assert body["method"] == {"type": "supervised", "whetstone": {"method": "qlora"},
                              "supervised": {"hyperparameters": {"n_epochs": 2, "lora_r": 8, "note": "x"}}}
    assert body["seed"] == 3
    assert job_body(args(method="orpo"))["method"] == {"type": "dpo", "whetstone": {"method": "orpo"}}
    with pytest.raises(SystemExit):
        job_body(args(method="rlhf"))
    with pytest.raises(SystemExit):
        job_body(args(hp=["no-equals"]))


def test_loss_curve_png(tmp_path):
    curve = LossCurve()
    for step, loss in enumerate([2.0, 1.5, 1.2, 1.1], start=1):
        curve.add(step, loss)
    curve.add_events([{"data": {"step": 5, "train_loss": 1.0}}, {"data": {"step": "x", "loss": 3}}, {"data": None}])
    assert sorted(curve.points) == [1, 2, 3, 4, 5]
    out = curve.save_png(tmp_path / "loss.png", "job")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eta_from_the_step_rate():
    rate: dict = {}
    job = {"progress": {"step": 10, "total_steps": 110}}
    assert eta_text(job, rate, now=100.0) == "-"
    job["progress"]["step"] = 20
    assert eta_text(job, rate, now=110.0) == "90s"   # 10 steps per 10 s, 90 steps left
