"""The node's heartbeat figures sampled for real: without nvidia-smi (CPU figures), and from a
stand-in nvidia-smi on the path (the sample output in tests/data)."""

from __future__ import annotations

from pathlib import Path

import pytest
from whetstone.contracts import NodeHeartbeatV1
from whetstone.trainer_agent.adapters.telemetry import NodeTelemetry

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).parents[1] / "data" / "nvidia-smi-query-gpu.csv"


async def test_heartbeat_figures_without_nvidia_smi_are_cpu_figures():
    figures = await NodeTelemetry(nvidia_smi="").sample()
    assert "gpus" not in figures
    assert 0 <= figures["cpu_percent"] <= 100 and figures["rss_mb"] > 10
    hb = NodeHeartbeatV1(node_id="n", gpu_type="cpu", gpu_count=1, sent_at="2026-01-01T00:00:00Z", **figures)
    assert hb.gpus == [] and hb.rss_mb == figures["rss_mb"]


async def test_heartbeat_figures_from_an_nvidia_smi_on_the_path(tmp_path: Path):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncase \"$*\" in *--query-gpu=index,name,utilization.gpu*) cat {SAMPLE};; "
                    "*) exit 9;; esac\n")
    tool.chmod(0o755)
    figures = await NodeTelemetry(nvidia_smi=str(tool)).sample()
    hb = NodeHeartbeatV1(node_id="n", gpu_type="H100", gpu_count=4, sent_at="2026-01-01T00:00:00Z", **figures)
    assert [g.index for g in hb.gpus] == [0, 1, 2, 3] and hb.gpus[0].utilization_pct == 97.0
    assert hb.cpu_percent is not None
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    broken.chmod(0o755)
    telemetry = NodeTelemetry(nvidia_smi=str(broken))
    assert "gpus" not in await telemetry.sample() and telemetry._failing   # logged once, heartbeat goes on
