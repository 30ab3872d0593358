"""Loading base + adapters once per evaluation, greedy generation, holdout loss (torch lives here).

A vision-language base (a model directory with an image processor) loads whole with its processor:
chats with images are rendered with the processor's image token, each expanded to its image's token
count and fed with the images' pixel values (modelkit's vision building blocks, as training and
serving use them); text-only chats go through the language model as for a text base."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..domain.rows import Conversation, ImageRef, Side, Turn

END_OF_TURN_TOKENS = ("<|end|>", "<|eot_id|>", "<|im_end|>", "<end_of_turn>")


def holds_full_weights(directory: str | None) -> bool:
    """A full fine-tune's or continued pre-training's artifact (its own weights), not a PEFT adapter."""
    from pathlib import Path

    from whetstone.runtime.weights import holds_full_weights as full

    return bool(directory) and full(p.name for p in Path(str(directory)).iterdir() if p.is_file())


class Models:
    """The base model with the candidate (and optionally the last accepted) adapter attached; a
    full-weight candidate (or last accepted model) is loaded as a model of its own beside the base.

    `use(side)` selects which one answers."""

    def __init__(self, base_dir: str, candidate_dir: str | None = None, last_dir: str | None = None):
        import torch
        from whetstone.modelkit.loading import load_model, load_tokenizer
        from whetstone.modelkit.vision import load_processor

        torch.manual_seed(0)
        self.tokenizer = load_tokenizer(base_dir)
        self.processor = load_processor(base_dir)   # None for a text-only base
        self.base = load_model(base_dir, dtype="float32")
        self.base.eval()
        self.model = self.base
        self.names: set[Side] = set()
        self.whole: dict[Side, Any] = {}   # full-weight models by side: no adapter to switch
        for side, directory in ((Side.CANDIDATE, candidate_dir), (Side.LAST, last_dir)):
            if holds_full_weights(directory):
                self.whole[side] = load_model(str(directory), dtype="float32").eval()
        if Side.CANDIDATE in self.whole:
            return
        if candidate_dir:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.base, candidate_dir, adapter_name="candidate")
            self.names.add(Side.CANDIDATE)
            if last_dir and Side.LAST not in self.whole:
                self.model.load_adapter(last_dir, adapter_name="last")
                self.names.add(Side.LAST)
            self.model.eval()

    @contextmanager
    def use(self, which: Side) -> Iterator[Any]:
        if which in self.whole:
            yield self.whole[which]
            return
        if which == Side.BASE:
            if self.names:
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
            return
        if which not in self.names:
            raise KeyError(f"no {which} adapter loaded")
        self.model.set_adapter(which)
        yield self.model

    def generate(self, which: Side, conversations: Sequence[Conversation], max_new_tokens: int = 32,
                 batch_size: int = 16) -> list[str]:
        import torch

        tok = self.tokenizer
        vocab = tok.get_vocab()
        stop_ids = sorted({i for i in (tok.eos_token_id, *(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab))
                           if isinstance(i, int)})
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        prompts = [self._prompt(c) for c in conversations]
        out: list[str] = []
        with self.use(which) as model, torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                encoded = [ids for ids, _ in prompts[i:i + batch_size]]
                pixels = [p for _, p in prompts[i:i + batch_size] if p is not None]
                images = {"pixel_values": torch.cat(pixels)} if pixels else {}
                width = max(len(e) for e in encoded)
                ids = torch.full((len(encoded), width), pad, dtype=torch.long)
                mask = torch.zeros((len(encoded), width), dtype=torch.long)
                for row, e in enumerate(encoded):  # left padding: every prompt ends where generation starts
                    ids[row, width - len(e):] = torch.tensor(e)
                    mask[row, width - len(e):] = 1
                gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=stop_ids or None, pad_token_id=pad, **images)
                for row in gen[:, width:]:
                    # U+0000 dropped: Postgres text and JSONB cannot hold it, and an untrained base emits it
                    out.append(tok.decode(row, skip_special_tokens=True).replace("\x00", "").strip())
        return out

    def _prompt(self, conversation: Conversation) -> tuple[list[int], Any]:
        """The generation prompt's token ids (image tokens expanded) and its images' pixel values (or None)."""
        from whetstone.modelkit.vision import (
            ImagePart,
            expand_image_tokens,
            image_size,
            image_token_counts,
            pixel_values,
            text_messages,
        )

        tok = self.tokenizer
        images = [image for turn in conversation for image in turn.images]
        if not images:
            text = tok.apply_chat_template(_chat(conversation), tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False)["input_ids"]), None
        if self.processor is None:
            raise ValueError("the held-out rows hold images but the base model has no image processor")
        token = self.processor.image_token
        text = tok.apply_chat_template(text_messages(_chat(conversation), token), tokenize=False,
                                       add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        counts = image_token_counts(self.processor, [image_size(i.url) for i in images])
        ids, _ = expand_image_tokens(ids, [0] * len(ids), tok.convert_tokens_to_ids(token), counts)
        return ids, pixel_values(self.processor, [ImagePart(i.url, i.detail) for i in images])

    def text_loss(self, which: Side, texts: Sequence[str], max_len: int = 512) -> tuple[float, int]:
        """(token-weighted mean next-token loss, tokens scored) over whole documents, every token trained
        as continued pre-training trains them (the tokenizer's own special tokens added)."""
        from whetstone.modelkit.holdout import examples_loss

        examples = []
        for text in texts:
            ids = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])[:max_len]
            if len(ids) > 1:
                examples.append({"input_ids": ids, "labels": ids})
        if not examples:
            raise ValueError("no document of the holdout has two tokens to score")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with self.use(which) as model:
            scored = examples_loss(model, examples, pad_id=pad)
        return float(scored["loss"]), int(scored["tokens"])

    def loss(self, which: Side, rows: Sequence[Conversation], max_len: int = 512) -> float:
        """Token-weighted mean next-token loss on the rows' assistant turns (for rows with images: their
        text tokens, the images fed as pixel values, as training feeds them)."""
        from whetstone.modelkit.holdout import holdout_loss, labelled_loss_sums

        chats = [_chat(r) for r in rows]
        with self.use(which) as model:
            if self.processor is None or not any(t.parts for r in rows for t in r):
                return float(holdout_loss(model, self.tokenizer, chats, max_len=max_len)["loss"])
            from whetstone.modelkit.vision import VisionCollator, vision_example

            examples = [vision_example(self.processor, chat, max_len) for chat in chats]
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            collate = VisionCollator(pad)
            sums = labelled_loss_sums(model, (collate(examples[i:i + 8]) for i in range(0, len(examples), 8)))
            if sums.tokens == 0:
                raise ValueError("no trained tokens in the holdout rows")
            return sums.loss / sums.tokens


def _content(turn: Turn) -> str | list[dict[str, Any]]:
    if not turn.parts:
        return str(turn.content)
    return [{"type": "image_url", "image_url": {"url": p.url, "detail": p.detail}} if isinstance(p, ImageRef)
            else {"type": "text", "text": p} for p in turn.parts]


def _chat(conversation: Conversation) -> list[dict[str, Any]]:
    """The messages as a chat template (and modelkit's tokenizer) reads them; a message with images keeps
    OpenAI's content parts (modelkit's vision helpers render them)."""
    return [{"role": t.role, "content": _content(t)} for t in conversation]
