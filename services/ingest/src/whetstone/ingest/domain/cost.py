"""Cost estimate: tokens x epochs -> GPU-hours per GPU type and method -> spot and on-demand price. Pure.

The throughput table gives training tokens/s per GPU for a reference model size
(7B by default); a model of N parameters is assumed to run ref/N times as fast (compute
per token is proportional to parameters), with the speed-up capped because small
models are bound by overheads, not FLOPs. Both tables are configuration: operators set
their measured throughputs and negotiated prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from whetstone.contracts.estimates import CostRow

REFERENCE_PARAMS = 7_000_000_000
MAX_SPEEDUP = 20.0

# tokens/s per GPU for a 7B model, bf16, packed sequences (DPO/ORPO count chosen + rejected tokens)
DEFAULT_THROUGHPUT: dict[str, dict[str, float]] = {
    "H100": {"lora": 3400, "qlora": 2300, "full": 2500, "dpo": 1700, "orpo": 2000, "cpt": 2500},
    "A100": {"lora": 1700, "qlora": 1150, "full": 1250, "dpo": 850, "orpo": 1000, "cpt": 1250},
    "L40S": {"lora": 1100, "qlora": 750, "dpo": 550, "orpo": 650},
    "A10G": {"lora": 450, "qlora": 300, "dpo": 220, "orpo": 260},
    "L4": {"lora": 380, "qlora": 260, "dpo": 190, "orpo": 220},
}
# USD per GPU-hour
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "H100": {"on_demand": 3.90, "spot": 1.60},
    "A100": {"on_demand": 2.30, "spot": 0.95},
    "L40S": {"on_demand": 1.60, "spot": 0.65},
    "A10G": {"on_demand": 1.00, "spot": 0.35},
    "L4": {"on_demand": 0.80, "spot": 0.30},
}
METHODS_FOR_PURPOSE = {"sft": ("lora", "qlora", "full"), "dpo": ("dpo", "orpo"), "cpt": ("cpt",), "eval": ()}


@dataclass(frozen=True)
class CostEstimate:
    tokens: int
    epochs: int
    tokens_x_epochs: int
    tokens_estimated: bool
    model_params: int
    params_source: str
    reference_params: int
    estimates: list[CostRow] = field(default_factory=list)     # cheapest first
    currency: str = "USD"

    @property
    def cheapest(self) -> CostRow | None:
        return self.estimates[0] if self.estimates else None

    def as_dict(self) -> dict[str, Any]:
        """The JSON of the report and of dataset.validated's `cost_estimate`."""
        return {"currency": self.currency, "tokens": self.tokens, "epochs": self.epochs,
                "tokens_x_epochs": self.tokens_x_epochs, "tokens_estimated": self.tokens_estimated,
                "model_params": self.model_params, "params_source": self.params_source,
                "reference_params": self.reference_params, "estimates": [r.model_dump() for r in self.estimates],
                "cheapest": self.cheapest.model_dump() if self.cheapest else None}


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def estimate_cost(tokens: int, epochs: int, purpose: str, model_params: int | None, *,
                  throughput: Mapping[str, Mapping[str, float]] = DEFAULT_THROUGHPUT,
                  prices: Mapping[str, Mapping[str, float]] = DEFAULT_PRICES,
                  reference_params: int = REFERENCE_PARAMS, tokens_estimated: bool = False,
                  params_source: str = "given") -> CostEstimate:
    """One row per (GPU type, method) the table knows for this purpose, cheapest first."""
    params = model_params or reference_params
    speed = min(MAX_SPEEDUP, reference_params / max(params, 1))
    trained = tokens * epochs
    rows: list[CostRow] = []
    for gpu, per_method in throughput.items():
        price = prices.get(gpu)
        for method in METHODS_FOR_PURPOSE.get(purpose, ()):
            tps = per_method.get(method)
            if not tps or not price:
                continue
            hours = trained / (tps * speed) / 3600
            rows.append(CostRow(gpu_type=gpu, method=method, tokens_per_s_per_gpu=_round(tps * speed),
                                gpu_hours=_round(hours), on_demand_usd=round(hours * price["on_demand"], 4),
                                spot_usd=round(hours * price["spot"], 4)))
    rows.sort(key=lambda r: (r.spot_usd, r.gpu_type, r.method))
    return CostEstimate(tokens, epochs, trained, tokens_estimated, params, params_source, reference_params, rows)
