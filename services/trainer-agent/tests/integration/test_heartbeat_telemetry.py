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
    assert figures.gpus == []
    assert figures.cpu_percent is not None and 0 <= figures.cpu_percent <= 100
    assert figures.rss_mb is not None and figures.rss_mb > 10


async def test_heartbeat_figures_from_an_nvidia_smi_on_the_path(tmp_path: Path):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncase \"$*\" in *--query-gpu=index,name,utilization.gpu*) cat {SAMPLE};; "
                    "*) exit 9;; esac\n")
    tool.chmod(0o755)
    figures = await NodeTelemetry(nvidia_smi=str(tool)).sample()
    hb = NodeHeartbeatV1(node_id="n", gpu_type="H100", gpu_count=4, sent_at="2026-01-01T00:00:00Z",
                         gpus=figures.gpus, cpu_percent=figures.cpu_percent, rss_mb=figures.rss_mb)
    assert [g.index for g in hb.gpus] == [0, 1, 2, 3] and hb.gpus[0].utilization_pct == 97.0
    assert hb.cpu_percent is not None
    assert NodeHeartbeatV1.model_validate_json(hb.model_dump_json()).gpus == figures.gpus   # carried as sampled
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    broken.chmod(0o755)
    telemetry = NodeTelemetry(nvidia_smi=str(broken))
    assert (await telemetry.sample()).gpus == [] and telemetry._failing   # logged once, heartbeat goes on
