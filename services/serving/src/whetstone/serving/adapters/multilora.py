"""Many LoRA adapters on one frozen base, each row of a batch with its own adapter.

Every adapter gets a slot; for every target Linear of the base the slots' A and B matrices are
stacked (slot 0 stays zero: "no adapter"). A forward hook adds, per row,
`x @ A[slot]^T @ B[slot]^T * scaling` with two batched matmuls over gathered slots, so a batch
of 32 rows on 32 different adapters costs about what 32 rows on one adapter cost. This is the
gathered-matmul idea of multi-LoRA servers (Punica, S-LoRA); PEFT's `adapter_names=` does the
same per unique adapter in a Python loop. Adapters are read in PEFT's format
(`adapter_config.json` + `adapter_model.safetensors`) and checked before any slot is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

from pydantic import BaseModel, JsonValue

from ..domain.catalog import AdapterIncompatible

_PREFIX = "base_model.model."


class LoraConfig(BaseModel):
    """adapter_config.json as far as serving reads it (PEFT writes many more fields)."""

    peft_type: str | None = None
    r: int | None = None
    lora_alpha: float | None = None
    use_rslora: bool | None = None
    bias: str | None = "none"
    lora_bias: bool | None = None
    fan_in_fan_out: bool | None = None
    rank_pattern: dict[str, JsonValue] | None = None
    alpha_pattern: dict[str, JsonValue] | None = None
    use_dora: bool | None = None
    modules_to_save: JsonValue = None
    trainable_token_indices: JsonValue = None
    layer_replication: JsonValue = None
    target_parameters: JsonValue = None

    @property
    def rank(self) -> int:
        return self.r or 0

    @property
    def scaling(self) -> float:
        """PEFT's: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA."""
        alpha = float(self.lora_alpha or self.rank)
        return alpha / math.sqrt(self.rank) if self.use_rslora else alpha / self.rank

    def refusal(self) -> str | None:
        """Why this server cannot apply the adapter, or None for a plain LoRA."""
        if self.peft_type != "LORA":
            return f"peft_type {self.peft_type!r} is not LORA"
        unsupported = {"DoRA": self.use_dora, "modules_to_save": self.modules_to_save,
                       "trainable tokens": self.trainable_token_indices, "layer replication": self.layer_replication,
                       "target_parameters": self.target_parameters}
        for what, value in unsupported.items():
            if value:
                return f"{what} adapters are not served"
        if (self.bias or "none") != "none" or self.lora_bias or self.fan_in_fan_out:
            return "LoRA bias / fan_in_fan_out adapters are not served"
        if self.rank_pattern or self.alpha_pattern:
            return "per-module rank/alpha patterns are not served"
        return None


def read_lora(directory: Path) -> tuple[LoraConfig, dict[str, tuple[Any, Any]]]:
    """(adapter_config, {module name: (A, B)}) from a PEFT LoRA directory; AdapterIncompatible if
    the adapter is not a plain LoRA this server can apply."""
    from safetensors.torch import load_file

    try:
        config = LoraConfig.model_validate_json((directory / "adapter_config.json").read_bytes())
    except (OSError, ValueError) as exc:
        raise AdapterIncompatible(f"adapter_config.json unreadable: {exc}") from exc
    refusal = config.refusal()
    if refusal is not None:
        raise AdapterIncompatible(refusal)
    weights_file = directory / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise AdapterIncompatible("adapter_model.safetensors missing (pickled weights are never loaded)")
    try:
        tensors = load_file(str(weights_file))
    except Exception as exc:
        raise AdapterIncompatible(f"adapter_model.safetensors unreadable: {exc}") from exc
    down: dict[str, Tensor] = {}   # module -> lora_A weight
    up: dict[str, Tensor] = {}     # module -> lora_B weight
    for key, tensor in tensors.items():
        for part, found in ((".lora_A.weight", down), (".lora_B.weight", up)):
            if key.endswith(part):
                found[key[: -len(part)].removeprefix(_PREFIX)] = tensor
                break
        else:
            raise AdapterIncompatible(f"unexpected tensor {key} in adapter_model.safetensors")
    if not down or set(down) != set(up):
        raise AdapterIncompatible("adapter_model.safetensors has no complete lora_A/lora_B pairs")
    return config, {m: (down[m], up[m]) for m in down}


class StackedLora:
    def __init__(self, model, *, slots: int, max_rank: int, gather_budget: int = 256 << 20, within: str = "") -> None:
        """`within`: only Linears whose name holds it get slots (a vision-language base: "language_model",
        so the vision tower, whose rows are images, never runs a row's LoRA)."""
        import torch

        self.torch, self.max_rank, self.slots = torch, max_rank, slots
        self.linears = {name: mod for name, mod in model.named_modules()
                        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}" and within in name}
        self.A: dict[str, Tensor] = {}     # module -> stacked lora_A weights, one slot per resident adapter
        self.B: dict[str, Tensor] = {}
        self.users: dict[str, int] = {}  # resident adapters targeting the module: 0 -> skip the hook
        self.slot_modules: dict[int, list[str]] = {}
        self.row_slots = None  # (batch,) long tensor, set before every forward
        self.row_rank = max_rank  # the largest rank among the batch's slots: padding beyond it is skipped
        self.slot_rank: dict[int, int] = {}
        self._slots_key: tuple[int, ...] | None = None  # the rows `_gather` was built for
        self._gather: dict[str, tuple[Tensor, Tensor]] = {}
        self._gather_bytes = 0
        self.gather_budget = gather_budget
        for name, mod in self.linears.items():
            dtype = mod.weight.dtype
            self.A[name] = torch.zeros((slots + 1, max_rank, mod.in_features), dtype=dtype)
            self.B[name] = torch.zeros((slots + 1, mod.out_features, max_rank), dtype=dtype)
            self.users[name] = 0
            mod.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        torch = self.torch

        def add_lora(_module, inputs, output):
            if not self.users[name] or self.row_slots is None:
                return output
            a, b = self._gathered(name)
            return output + torch.bmm(torch.bmm(inputs[0], a), b)

        return add_lora

    def _gathered(self, name: str):
        """This module's (A^T, B^T) for the current rows, (batch, in, r) and (batch, r, out): gathered
        once per `use()` and reused by the following forward passes (decode steps) while the rows
        stay the same, within `gather_budget` bytes over all modules (beyond it: every pass)."""
        got = self._gather.get(name)
        if got is None:
            r = self.row_rank
            got = (self.A[name][:, :r].index_select(0, self.row_slots).transpose(1, 2).contiguous(),
                   self.B[name][:, :, :r].index_select(0, self.row_slots).transpose(1, 2).contiguous())
            size = sum(t.numel() * t.element_size() for t in got)
            if self._gather_bytes + size <= self.gather_budget:
                self._gather[name] = got
                self._gather_bytes += size
        return got

    def check(self, config: LoraConfig, pairs: dict[str, tuple[Any, Any]]) -> None:
        r = config.rank
        if not 1 <= r <= self.max_rank:
            raise AdapterIncompatible(f"LoRA rank {r} is outside 1..{self.max_rank} (max_lora_rank)")
        for module, (a, b) in pairs.items():
            mod = self.linears.get(module)
            if mod is None:
                raise AdapterIncompatible(f"the adapter targets {module}, which the served base has no Linear for")
            if tuple(a.shape) != (r, mod.in_features) or tuple(b.shape) != (mod.out_features, r):
                raise AdapterIncompatible(f"{module}: LoRA shapes {tuple(a.shape)}/{tuple(b.shape)} do not fit "
                                          f"the base layer ({mod.in_features} -> {mod.out_features}, r={r})")

    def put(self, slot: int, config: LoraConfig, pairs: dict[str, tuple[Any, Any]]) -> None:
        self.check(config, pairs)
        r, scaling = config.rank, config.scaling
        self.clear(slot)
        for module, (a, b) in pairs.items():
            self.A[module][slot, :r] = a.to(self.A[module].dtype)
            self.B[module][slot, :, :r] = (b * scaling).to(self.B[module].dtype)
            self.users[module] += 1
        self.slot_modules[slot] = list(pairs)
        self.slot_rank[slot] = r

    def use(self, slots: list[int]) -> None:
        """Set the rows of the next forward passes (slot 0: the base alone)."""
        key = tuple(slots)
        if key == self._slots_key:
            return  # the same rows as the last pass (a decode step): the gathered weights still hold
        self._slots_key, self._gather, self._gather_bytes = key, {}, 0
        self.row_slots = self.torch.tensor(slots, dtype=self.torch.long)
        self.row_rank = max([self.slot_rank.get(s, 1) for s in slots] or [1])

    def clear(self, slot: int) -> None:
        self._slots_key, self._gather, self._gather_bytes = None, {}, 0  # a slot's weights change: gather again
        self.slot_rank.pop(slot, None)
        for module in self.slot_modules.pop(slot, []):
            self.A[module][slot].zero_()
            self.B[module][slot].zero_()
            self.users[module] -= 1
