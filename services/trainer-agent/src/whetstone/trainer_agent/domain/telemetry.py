"""Node telemetry, pure: the `nvidia-smi` CSV the heartbeat carries, and model FLOPs utilisation
(MFU) from a GPU type's peak throughput."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from whetstone.contracts import GpuSample

# The fields asked of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`, in this order.
NVIDIA_SMI_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw",
                     "temperature.gpu")
NVIDIA_SMI_ARGS = (f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits")

# Dense bf16 tensor-core peak per GPU (FLOP/s, no structured sparsity), from the vendors' data sheets.
# Matched on the GPU type a node announces or the name nvidia-smi reports (case-insensitive).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("gh200", 989e12),
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),
    ("b200", 2250e12),
    ("a100", 312e12),
    ("a10g", 70e12),   # before "a10": the AWS part
    ("a10", 125e12),
    ("l40s", 362e12),
    ("l40", 181e12),
    ("l4", 121e12),
    ("a6000", 155e12),
    ("v100", 125e12),  # fp16 (no bf16 on Volta)
)


@dataclass(frozen=True)
class NodeFigures:
    """The heartbeat's hardware fields: per-GPU samples (none without a working nvidia-smi), the node's
    CPU busy % and the resident memory of the agent and its training processes."""

    cpu_percent: float | None
    rss_mb: float | None
    gpus: list[GpuSample] = field(default_factory=list)


def _number(text: str) -> float | None:
    """nvidia-smi writes `[N/A]`, `[Not Supported]` or `N/A` for a field it cannot read."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(output: str) -> list[GpuSample]:
    """One sample per line of `nvidia-smi` CSV output (NVIDIA_SMI_ARGS). A line that is not a GPU
    line (a header, a warning, fewer fields) raises ValueError naming the line; so does a figure the
    heartbeat cannot carry (a negative memory or power reading: pydantic's ValidationError)."""
    readings = []
    for lineno, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(NVIDIA_SMI_FIELDS):  # a GPU name with a comma: the name takes the extra cells
            extra = len(cells) - len(NVIDIA_SMI_FIELDS)
            cells = [cells[0], ", ".join(cells[1:2 + extra]), *cells[2 + extra:]]
        if len(cells) != len(NVIDIA_SMI_FIELDS) or not cells[0].isdigit():
            raise ValueError(f"nvidia-smi line {lineno}: expected {len(NVIDIA_SMI_FIELDS)} fields "
                             f"({', '.join(NVIDIA_SMI_FIELDS)}), got {line.strip()[:200]!r}")
        util, used, total, power, temp = (_number(c) for c in cells[2:])
        readings.append(GpuSample(index=int(cells[0]), name=cells[1] or None, utilization_pct=util,
                                  memory_used_mb=used, memory_total_mb=total, power_w=power, temperature_c=temp))
    return readings


def peak_flops(gpu_type: str | None) -> float | None:
    """Peak dense bf16 FLOP/s of one GPU of this type; None for CPU or an unknown type."""
    if not gpu_type:
        return None
    name = re.sub(r"[\s_-]+", " ", gpu_type.lower())
    for key, flops in PEAK_BF16_FLOPS:
        if key in name or key.replace(" ", "") in name.replace(" ", ""):
            return flops
    return None


def mfu(params: int | None, tokens_per_s: float | None, gpu_type: str | None, gpus: int = 1) -> float | None:
    """Model FLOPs utilisation: 6 * params * tokens/s (forward + backward) over the peak of the GPUs
    doing the work. None when any input is unknown (CPU, unknown GPU type, no throughput yet)."""
    peak = peak_flops(gpu_type)
    if peak is None or not params or not tokens_per_s or tokens_per_s <= 0 or gpus < 1:
        return None
    return round(6.0 * params * tokens_per_s / (peak * gpus), 6)

