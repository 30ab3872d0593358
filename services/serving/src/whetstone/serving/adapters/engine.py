"""The one shared base model and its LoRA adapters, driven from ONE worker thread.

Generation is iteration-level batching over a left-padded KV cache (`RunningBatch`): requests join
between decode steps and leave when they finish. In a mixed batch each row carries its adapter's
slot and every row gets its own LoRA weights in the same forward pass (see multilora.py); the
baseline (`mixed=False`) runs one adapter per pass.

A vision-language base (a directory with an image processor, e.g. `whet models create-tiny
--vision`) is loaded with its processor: a chat's images become the processor's image tokens
(each expanded to the tokens the processor inserts for it, as in training) and their pixel
values go into the prefill of their row; decode steps read the KV cache only. LoRA slots cover
the language model's Linears only (adapters train the language model; the vision tower stays
the base's).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whetstone.modelkit.loading import load_model, load_tokenizer
from whetstone.modelkit.vision import (ImagePart, expand_image_tokens, image_size, image_token_counts,
                                       load_processor, load_vision_model, pixel_values)

from ..domain.catalog import BASE_ADAPTER
from .multilora import StackedLora, read_lora


@dataclass
class GenRow:
    """One sequence to generate; `emit(delta_text, finish_reason)` is called from the worker thread.
    `stream=False` (and no stops): the text is decoded once, at the end, not after every token."""

    adapter: str
    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[str, str | None], None]
    temperature: float = 1.0
    top_p: float = 1.0
    stops: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = True
    pixel_values: Any = None    # the row's images (a tensor, one per image), fed to its prefill only
    arrived: float = field(default_factory=time.monotonic)
    completion_tokens: int = 0


class _RowState:
    def __init__(self, row: GenRow, engine: LoraEngine) -> None:
        self.row, self.engine = row, engine
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already emitted
        self.done = False
        self.holdback = max((len(s) for s in row.stops), default=1) - 1
        self.generator = None
        if row.seed is not None and row.temperature > 0:
            self.generator = engine.torch.Generator().manual_seed(row.seed)

    def finish(self, text: str, reason: str) -> None:
        self.row.emit(text[self.sent:], reason)
        self.sent, self.done = len(text), True

    def push(self, token: int) -> None:
        row = self.row
        row.completion_tokens += 1
        if token in self.engine.eos_ids:
            return self.finish(self.text(), "stop")
        self.ids.append(token)
        if not (row.stream or row.stops):  # nobody reads the text before the end
            if len(self.ids) >= row.max_tokens:
                self.finish(self.text(), "length")
            return
        text = self.text()
        cuts = [i for i in (text.find(s) for s in row.stops) if i >= 0]
        if cuts:
            return self.finish(text[:min(cuts)], "stop")
        if len(self.ids) >= row.max_tokens:
            return self.finish(text, "length")
        safe = len(text) - self.holdback
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            safe = min(safe, len(text) - 1)
        if safe > self.sent:
            row.emit(text[self.sent:safe], None)
            self.sent = safe

    def text(self) -> str:
        return self.engine.tokenizer.decode(self.ids, skip_special_tokens=True)


class LoraEngine:
    """Not thread-safe on purpose: only the batcher's worker thread calls load/unload/generate."""

    def __init__(self, base_dir: str | Path, *, slots: int, max_rank: int = 64, threads: int = 0) -> None:
        """`slots`: adapters resident at once (the LRU budget); `max_rank`: the largest LoRA rank accepted."""
        import torch

        self.torch = torch
        if not threads:  # auto: one core stays with the event loop (HTTP, Kafka) that feeds this thread;
            # intra-op threads oversubscribing the cores make every small op wait for a descheduled peer
            threads = max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)) - 1))
        torch.set_num_threads(threads)
        self.threads = threads
        self.tokenizer = load_tokenizer(base_dir)
        self.processor = load_processor(base_dir)   # None: a text-only base
        base = (load_vision_model(base_dir, dtype="float32") if self.processor is not None
                else load_model(base_dir, dtype="float32"))
        base.eval()
        text_config = getattr(base.config, "text_config", None) or base.config
        self.context_length = int(getattr(text_config, "max_position_embeddings", 0)
                                  or self.tokenizer.model_max_length)
        eos = base.generation_config.eos_token_id if base.generation_config else None
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.model = base
        self.lora = StackedLora(base, slots=slots, max_rank=max_rank,
                                within="language_model" if self.processor is not None else "")
        self.adapters: dict[str, int] = {}  # loaded adapter name -> slot
        self._free = list(range(slots, 0, -1))

    # -- adapters ---------------------------------------------------------------
    @staticmethod
    def read(directory: Path):
        """Parse and check an adapter directory (any thread): AdapterIncompatible when unusable."""
        return read_lora(directory)

    def load(self, name: str, parsed) -> None:
        """Copy a parsed adapter into a free slot (worker thread)."""
        config, pairs = parsed
        self.lora.check(config, pairs)
        if name in self.adapters:
            return
        if not self._free:
            raise RuntimeError("no free adapter slot: evict first")
        slot = self._free.pop()
        self.lora.put(slot, config, pairs)
        self.adapters[name] = slot

    def slot_of(self, name: str) -> int | None:
        """The slot a row of `name` runs in: 0 for the base alone (BASE_ADAPTER), None when not loaded."""
        return 0 if name == BASE_ADAPTER else self.adapters.get(name)

    def unload(self, name: str) -> None:
        slot = self.adapters.pop(name, None)
        if slot is not None:
            self.lora.clear(slot)
            self._free.append(slot)

    # -- tokens -----------------------------------------------------------------
    def render_chat(self, messages: list[dict[str, str]], template: str | None) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  chat_template=template or self.tokenizer.chat_template)

    @property
    def sees_images(self) -> bool:
        return self.processor is not None

    @property
    def image_token(self) -> str:
        """What a chat's image is written as before tokenizing ("" for a text-only base)."""
        return str(self.processor.image_token) if self.processor is not None else ""

    def image_inputs(self, ids: list[int], urls: list[str]) -> tuple[list[int], Any]:
        """A prompt's image tokens expanded to each image's token count, and the images' pixel values
        (None without images). ValueError when the prompt's image tokens are not one per image (the
        text itself holds the image token)."""
        if self.processor is None:
            return ids, None
        image_id = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        if ids.count(image_id) != len(urls):
            raise ValueError(f"the text of the messages contains the image token {self.processor.image_token!r}; "
                             "send images as image_url parts only")
        if not urls:
            return ids, None
        counts = image_token_counts(self.processor, [image_size(url) for url in urls])
        expanded, _ = expand_image_tokens(ids, [0] * len(ids), image_id, counts)
        return expanded, pixel_values(self.processor, [ImagePart(url) for url in urls])

    def encode(self, text: str) -> list[int]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer itself: the Python wrapper costs more than the work
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- generation -------------------------------------------------------------
    def generate(self, rows: list[GenRow], *, mixed: bool) -> None:
        """Run the rows to completion in one batch (no newcomers). Mixed: one forward pass serves
        every row's own adapter; otherwise every row must name the same adapter."""
        batch = RunningBatch(self)
        batch.admit(rows, mixed=mixed)
        while batch.rows:
            batch.step()

    def _choose(self, logits, states: list[_RowState]):
        torch = self.torch
        chosen = logits.argmax(dim=-1)
        for i, state in enumerate(states):
            row = state.row
            if state.done or row.temperature == 0:
                continue
            probs = torch.softmax(logits[i].float() / row.temperature, dim=-1)
            if row.top_p < 1:
                ordered, order = probs.sort(descending=True)
                keep = ordered.cumsum(-1) - ordered < row.top_p  # always keeps the most likely token
                probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
            chosen[i] = torch.multinomial(probs, 1, generator=state.generator)[0]
        return chosen


class RunningBatch:
    """Iteration-level (continuous) batching: rows join between decode steps and leave the moment
    they finish. Every row's KV cache stays left-padded in one HF DynamicCache: a newcomer is
    prefilled on its own (with the other newcomers), then its cache is padded on the left (or the
    running rows' are) to the common length and concatenated along the batch dimension; a finished
    row is dropped with `batch_select_indices`, and columns no row attends any more are cut."""

    def __init__(self, engine: LoraEngine) -> None:
        self.engine, self.torch = engine, engine.torch
        self.rows: list[_RowState] = []
        self.slots: list[int] = []   # each row's adapter slot when it joined
        self.cache = None            # DynamicCache of the running rows
        self.attn = None             # (rows, cache length + 1): which columns each row attends
        self.pos = None              # (rows, 1): position id of each row's next input token
        self.next_ids = None         # (rows,): the token each row feeds next

    @property
    def adapters(self) -> set[str]:
        return {s.row.adapter for s in self.rows}

    def admit(self, rows: list[GenRow], *, mixed: bool = True) -> None:
        """Prefill `rows` and choose their first tokens; the unfinished ones join the batch."""
        if not rows:
            return
        torch, engine = self.torch, self.engine
        names = {r.adapter for r in rows} | (self.adapters if not mixed else set())
        if not mixed and len(names) > 1:
            raise ValueError("a one-adapter batch got several adapters")
        slots = [engine.slot_of(r.adapter) for r in rows]
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), engine.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r.prompt_ids)
            ids[i, width - n:] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attn[i, width - n:] = 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        states = [_RowState(r, engine) for r in rows]
        pixels = [r.pixel_values for r in rows if r.pixel_values is not None]
        images = {"pixel_values": torch.cat(pixels)} if pixels else {}
        engine.lora.use(slots)
        with torch.inference_mode():
            out = engine.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, **images)
            chosen = engine._choose(out.logits[:, -1, :], states)
        for state, token in zip(states, chosen.tolist()):
            state.push(token)
        keep = [i for i, s in enumerate(states) if not s.done]
        if not keep:
            return
        cache = out.past_key_values
        if len(keep) < len(states):
            index = torch.tensor(keep, dtype=torch.long)
            cache.batch_select_indices(index)
            attn, chosen, positions = attn[index], chosen[index], positions[index]
        joining = [states[i] for i in keep]
        try:
            self._merge(cache, attn, positions[:, -1:] + 1, chosen, joining, [slots[i] for i in keep])
        except Exception as exc:  # rows that already streamed a token still get their ending
            for state in joining:
                state.row.emit(f"{type(exc).__name__}: {exc}", "error")
            raise

    def _merge(self, cache, attn, pos, next_ids, states: list[_RowState], slots: list[int]) -> None:
        torch = self.torch
        if not self.rows:
            self.cache, self.attn, self.pos, self.next_ids = cache, attn, pos, next_ids
        else:
            pad = torch.nn.functional.pad
            width = max(self.attn.shape[1], attn.shape[1])
            old, new = width - self.attn.shape[1], width - attn.shape[1]
            for mine, theirs in zip(self.cache.layers, cache.layers):
                mine.keys = torch.cat([pad(mine.keys, (0, 0, old, 0)), pad(theirs.keys, (0, 0, new, 0))])
                mine.values = torch.cat([pad(mine.values, (0, 0, old, 0)), pad(theirs.values, (0, 0, new, 0))])
            self.attn = torch.cat([pad(self.attn, (old, 0)), pad(attn, (new, 0))])
            self.pos = torch.cat([self.pos, pos])
            self.next_ids = torch.cat([self.next_ids, next_ids])
        self.rows += states
        self.slots += slots

    def step(self) -> None:
        """One decode step for every running row; finished rows leave at once."""
        if not self.rows:
            return
        torch, engine = self.torch, self.engine
        self.attn = torch.cat([self.attn, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        engine.lora.use(self.slots)
        with torch.inference_mode():
            out = engine.model(input_ids=self.next_ids[:, None], attention_mask=self.attn, position_ids=self.pos,
                               past_key_values=self.cache, use_cache=True)
            chosen = engine._choose(out.logits[:, -1, :], self.rows)
        self.cache, self.next_ids, self.pos = out.past_key_values, chosen, self.pos + 1
        for state, token in zip(self.rows, chosen.tolist()):
            state.push(token)
        self.keep([i for i, s in enumerate(self.rows) if not s.done])

    def keep(self, indices: list[int]) -> None:
        """Only the rows at `indices` go on; columns no remaining row attends are cut."""
        if len(indices) == len(self.rows):
            return
        if not indices:
            self.rows, self.slots, self.cache = [], [], None
            return
        index = self.torch.tensor(indices, dtype=self.torch.long)
        self.cache.batch_select_indices(index)
        self.attn, self.pos, self.next_ids = self.attn[index], self.pos[index], self.next_ids[index]
        self.rows = [self.rows[i] for i in indices]
        self.slots = [self.slots[i] for i in indices]
        first = int(self.attn.any(dim=0).int().argmax())
        if first > 0:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.attn = self.attn[:, first:]

    def fail(self, message: str, *, only: set[str] | None = None) -> None:
        """Finish running rows with an error: all of them, or those whose adapter is in `only`."""
        doomed = [i for i, s in enumerate(self.rows) if only is None or s.row.adapter in only]
        for i in doomed:
            self.rows[i].row.emit(message, "error")
            self.rows[i].done = True
        self.keep([i for i, s in enumerate(self.rows) if not s.done])

    def orphans(self) -> set[str]:
        """Adapters of running rows that are no longer in the slot the rows joined with."""
        return {s.row.adapter for s, slot in zip(self.rows, self.slots)
                if self.engine.slot_of(s.row.adapter) != slot}
