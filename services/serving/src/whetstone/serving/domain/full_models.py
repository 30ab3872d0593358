"""Full-weight models (a full fine-tune or continued pre-training): served as a base of their own,
within the operator's memory budget for them. Pure.

A full-weight version holds its own weights instead of an adapter (`whetstone.runtime.weights`). It runs
in an engine of its own beside the served base; the weights of every resident one count against
`WHETSTONE_SERVING_FULL_MODEL_BUDGET_MB`. One that cannot fit even alone is refused with a 409 naming
the budget and the vLLM handoff (the registry lays full models out for `vllm serve`)."""

from __future__ import annotations

from collections.abc import Mapping

from whetstone.runtime.weights import holds_full_weights

from .catalog import ModelVersion, ServingError

MIB = 1024 * 1024
BUDGET_SETTING = "WHETSTONE_SERVING_FULL_MODEL_BUDGET_MB"


class FullModelOverBudget(ServingError):
    status, code, param = 409, "model_exceeds_serving_budget", "model"


def is_full_weights(version: ModelVersion) -> bool:
    return holds_full_weights(version.files)


def over_budget(version: ModelVersion, weights_bytes: int, budget_bytes: int) -> FullModelOverBudget | None:
    """The refusal for a full-weight model whose weights alone exceed the budget, or None when it fits."""
    if weights_bytes <= budget_bytes:
        return None
    return FullModelOverBudget(
        f"`{version.fine_tuned_model or version.name}` is a full-weight model ({weights_bytes / MIB:.1f} MiB of "
        f"weights); this server's memory budget for full-weight models is {budget_bytes / MIB:.1f} MiB "
        f"({BUDGET_SETTING}). Serve it with vLLM: the registry's vLLM handoff lays it out with whetstone_vllm.json "
        "(`vllm serve <its directory>`), or raise the budget.")


def to_evict(resident: Mapping[str, int], pinned: set[str], incoming: int, budget_bytes: int) -> list[str] | None:
    """Least recently used first (`resident` in LRU order, bytes each): the unpinned models to unload so
    `incoming` bytes fit, or None when even unloading every unpinned one leaves too little room."""
    used, victims = sum(resident.values()), []
    for model_id, size in resident.items():
        if used + incoming <= budget_bytes:
            break
        if model_id in pinned:
            continue
        victims.append(model_id)
        used -= size
    return victims if used + incoming <= budget_bytes else None
