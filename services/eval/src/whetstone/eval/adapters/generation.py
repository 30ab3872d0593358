"""Loading base + adapters once per evaluation, greedy generation, holdout loss (torch lives here)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..domain.rows import Conversation, Side

END_OF_TURN_TOKENS = ("<|end|>", "<|eot_id|>", "<|im_end|>", "<end_of_turn>")


class Models:
    """The base model with the candidate (and optionally the last accepted) adapter attached.

    `use(side)` selects which one answers."""

    def __init__(self, base_dir: str, candidate_dir: str | None = None, last_dir: str | None = None):
        import torch
        from whetstone.modelkit.loading import load_model, load_tokenizer

        torch.manual_seed(0)
        self.tokenizer = load_tokenizer(base_dir)
        self.base = load_model(base_dir, dtype="float32")
        self.base.eval()
        self.model = self.base
        self.names: set[Side] = set()
        if candidate_dir:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.base, candidate_dir, adapter_name="candidate")
            self.names.add(Side.CANDIDATE)
            if last_dir:
                self.model.load_adapter(last_dir, adapter_name="last")
                self.names.add(Side.LAST)
            self.model.eval()

    @contextmanager
    def use(self, which: Side) -> Iterator[Any]:
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
        texts = [tok.apply_chat_template(_chat(c), tokenize=False, add_generation_prompt=True) for c in conversations]
        out: list[str] = []
        with self.use(which) as model, torch.no_grad():
            for i in range(0, len(texts), batch_size):
                encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts[i:i + batch_size]]
                width = max(len(e) for e in encoded)
                ids = torch.full((len(encoded), width), pad, dtype=torch.long)
                mask = torch.zeros((len(encoded), width), dtype=torch.long)
                for row, e in enumerate(encoded):  # left padding: every prompt ends where generation starts
                    ids[row, width - len(e):] = torch.tensor(e)
                    mask[row, width - len(e):] = 1
                gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=stop_ids or None, pad_token_id=pad)
                for row in gen[:, width:]:
                    out.append(tok.decode(row, skip_special_tokens=True).strip())
        return out

    def loss(self, which: Side, rows: Sequence[Conversation], max_len: int = 512) -> float:
        """Token-weighted mean next-token loss on the rows' assistant turns."""
        from whetstone.modelkit.holdout import holdout_loss

        with self.use(which) as model:
            return float(holdout_loss(model, self.tokenizer, [_chat(r) for r in rows], max_len=max_len)["loss"])


def _chat(conversation: Conversation) -> list[dict[str, str]]:
    """The messages as a chat template (and modelkit's tokenizer) reads them."""
    return [{"role": t.role, "content": t.content} for t in conversation]
