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

import json
import math
from pathlib import Path
from typing import Any

from whetstone.serving.domain.catalog import AdapterIncompatible

_PREFIX = "base_model.model."
_UNSUPPORTED = {"use_dora": "DoRA", "modules_to_save": "modules_to_save", "trainable_token_indices": "trainable tokens",
                "layer_replication": "layer replication", "target_parameters": "target_parameters"}


def read_lora(directory: Path) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """(adapter_config, {module name: (A, B)}) from a PEFT LoRA directory; AdapterIncompatible if
    the adapter is not a plain LoRA this server can apply."""
    from safetensors.torch import load_file

    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise AdapterIncompatible(f"adapter_config.json unreadable: {exc}") from exc
    if config.get("peft_type") != "LORA":
        raise AdapterIncompatible(f"peft_type {config.get('peft_type')!r} is not LORA")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise AdapterIncompatible(f"{what} adapters are not served")
    if config.get("bias", "none") != "none" or config.get("lora_bias") or config.get("fan_in_fan_out"):
        raise AdapterIncompatible("LoRA bias / fan_in_fan_out adapters are not served")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterIncompatible("per-module rank/alpha patterns are not served")
    weights_file = directory / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise AdapterIncompatible("adapter_model.safetensors missing (pickled weights are never loaded)")
    try:
        tensors = load_file(str(weights_file))
    except Exception as exc:
        raise AdapterIncompatible(f"adapter_model.safetensors unreadable: {exc}") from exc
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.weight"
            if key.endswith(marker):
                module = key[: -len(marker)].removeprefix(_PREFIX)
                pairs.setdefault(module, {})[part] = tensor
                break
        else:
            raise AdapterIncompatible(f"unexpected tensor {key} in adapter_model.safetensors")
    if not pairs or any(len(p) != 2 for p in pairs.values()):
        raise AdapterIncompatible("adapter_model.safetensors has no complete lora_A/lora_B pairs")
    return config, {m: (p["lora_A"], p["lora_B"]) for m, p in pairs.items()}


class StackedLora:
    def __init__(self, model, *, slots: int, max_rank: int, gather_budget: int = 256 << 20) -> None:
        import torch

        self.torch, self.max_rank, self.slots = torch, max_rank, slots
        self.linears = {name: mod for name, mod in model.named_modules()
                        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}"}
        self.A: dict[str, Any] = {}
        self.B: dict[str, Any] = {}
        self.users: dict[str, int] = {}  # resident adapters targeting the module: 0 -> skip the hook
        self.slot_modules: dict[int, list[str]] = {}
        self.row_slots = None  # (batch,) long tensor, set before every forward
        self.row_rank = max_rank  # the largest rank among the batch's slots: padding beyond it is skipped
        self.slot_rank: dict[int, int] = {}
        self._slots_key: tuple[int, ...] | None = None  # the rows `_gather` was built for
        self._gather: dict[str, tuple[Any, Any]] = {}
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

    def check(self, config: dict[str, Any], pairs: dict[str, tuple[Any, Any]]) -> None:
        r = int(config.get("r") or 0)
        if not 1 <= r <= self.max_rank:
            raise AdapterIncompatible(f"LoRA rank {r} is outside 1..{self.max_rank} (max_lora_rank)")
        for module, (a, b) in pairs.items():
            mod = self.linears.get(module)
            if mod is None:
                raise AdapterIncompatible(f"the adapter targets {module}, which the served base has no Linear for")
            if tuple(a.shape) != (r, mod.in_features) or tuple(b.shape) != (mod.out_features, r):
                raise AdapterIncompatible(f"{module}: LoRA shapes {tuple(a.shape)}/{tuple(b.shape)} do not fit "
                                          f"the base layer ({mod.in_features} -> {mod.out_features}, r={r})")

    def put(self, slot: int, config: dict[str, Any], pairs: dict[str, tuple[Any, Any]]) -> None:
        self.check(config, pairs)
        r, alpha = int(config["r"]), float(config.get("lora_alpha") or config["r"])
        scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
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
