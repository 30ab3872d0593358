"""Node telemetry: the nvidia-smi CSV parser (on an output in the format of
`nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu
--format=csv,noheader,nounits`, four GPUs of three types, with the [N/A] and [Not Supported] cells
nvidia-smi writes for a field it cannot read), MFU and the recipe's progress meter. The heartbeat
sampler itself: integration/test_heartbeat_telemetry.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from whetstone.trainer_agent.domain.telemetry import mfu, parse_nvidia_smi, peak_flops

pytestmark = pytest.mark.unit

SAMPLE = Path(__file__).parents[1] / "data" / "nvidia-smi-query-gpu.csv"


def test_parses_each_gpu_and_leaves_unreadable_fields_empty():
    gpus = parse_nvidia_smi(SAMPLE.read_text())
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    h100 = gpus[0]
    assert (h100.name, h100.utilization_pct, h100.memory_used_mb, h100.memory_total_mb, h100.power_w,
            h100.temperature_c) == ("NVIDIA H100 80GB HBM3", 97.0, 71342.0, 81559.0, 688.51, 64.0)
    assert gpus[2].name == "NVIDIA L4" and gpus[2].power_w is None and gpus[2].utilization_pct == 45.0
    assert gpus[3].power_w is None and gpus[3].temperature_c is None and gpus[3].memory_used_mb == 2000.0


def test_a_line_that_is_not_a_gpu_line_is_named():
    with pytest.raises(ValueError, match="line 1"):
        parse_nvidia_smi("index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power, temp\n")
    with pytest.raises(ValueError, match="line 2: expected 7 fields"):
        parse_nvidia_smi("0, NVIDIA L4, 1, 2, 3, 4, 5\n0, NVIDIA L4, 1\n")
    assert parse_nvidia_smi("\n") == []
    odd = parse_nvidia_smi("0, Tesla T4, custom, 1, 2, 3, 4, 5\n")  # a name with a comma
    assert odd[0].name == "Tesla T4, custom" and odd[0].utilization_pct == 1.0


def test_mfu_only_where_the_gpu_is_known():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("H100") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and peak_flops("L4") == 121e12
    assert peak_flops("NVIDIA A10G") == 70e12 and peak_flops("cpu") is None and peak_flops(None) is None
    # 7B params at 3000 tokens/s on one H100: 6 * 7e9 * 3000 / 989e12
    assert mfu(7_000_000_000, 3000.0, "NVIDIA H100 80GB HBM3") == pytest.approx(0.127401, abs=1e-6)
    assert mfu(7_000_000_000, 24000.0, "H100", gpus=8) == pytest.approx(0.127401, abs=1e-6)
    assert mfu(7_000_000_000, 3000.0, None) is None and mfu(None, 3000.0, "H100") is None
    assert mfu(7_000_000_000, 0.0, "H100") is None


def test_progress_reports_step_time_and_mfu_on_a_known_gpu():
    from types import SimpleNamespace

    from whetstone.trainer_agent.recipes.metrics import ProgressMeter

    meter = ProgressMeter()
    state = SimpleNamespace(num_input_tokens_seen=0, global_step=0, max_steps=10, epoch=0.0)
    meter.start(state)
    assert meter.params is None  # no model given: no MFU
    meter.params, meter.gpu_type = 7_000_000_000, "NVIDIA H100 80GB HBM3"
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1, world_size=2)
    state.num_input_tokens_seen, state.global_step = 1_000_000, 4
    time.sleep(0.01)  # four steps take time
    p = meter.measure(args, state, {"loss": 1.0})
    assert p.step_time_s > 0 and p.tokens_per_s > 0
    assert p.mfu == pytest.approx(6 * 7e9 * p.tokens_per_s / (989e12 * 2), rel=1e-4)
    meter.gpu_type = None  # CPU
    state.num_input_tokens_seen, state.global_step = 2_000_000, 8
    assert meter.measure(args, state, {"loss": 1.0}).mfu is None
