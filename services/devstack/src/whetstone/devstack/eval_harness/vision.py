"""A vision candidate for the eval gate (test support): the tiny random LLaVA base
(`whet models create-tiny --vision`), chats that ask the colour of a generated picture (one word that
text alone cannot give), and a LoRA on the language model trained on them with modelkit's vision
building blocks (the same examples and collator the trainer uses)."""

from __future__ import annotations

import base64
import io
import json
import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "white": (250, 250, 250)}


def picture(rgb: tuple[int, int, int], size: int = 8) -> dict:
    """An OpenAI image part holding a PNG of one colour."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def colour_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` chats (colours in turn, shades jittered by `seed`): a picture and a question, the colour's name."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name = list(COLOURS)[i % len(COLOURS)]
        rgb = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLOURS[name])
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Which colour?"}, picture(rgb)]},
            {"role": "assistant", "content": name}]})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def train_vision_adapter(base_dir: Path, rows: list[dict], out_dir: Path, *, steps: int = 60, batch: int = 8,
                         lr: float = 1e-2, rank: int = 8, seed: int = 0) -> Path:
    """A LoRA on the language model's attention (vision tower and projector frozen), trained on `rows`'
    assistant tokens; saved under `out_dir` as a PEFT adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from whetstone.modelkit.vision import (
        VisionCollator,
        language_lora_targets,
        load_processor,
        load_vision_model,
        vision_example,
    )

    torch.manual_seed(seed)
    processor = load_processor(base_dir)
    model = get_peft_model(load_vision_model(base_dir, dtype="float32"),
                           LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                      target_modules=language_lora_targets()))
    examples = [vision_example(processor, r["messages"]) for r in rows]
    tok = processor.tokenizer
    collate = VisionCollator(tok.pad_token_id if tok.pad_token_id is not None else 0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    order = random.Random(seed)
    model.train()
    for _ in range(steps):
        out = model(**collate(order.sample(examples, min(batch, len(examples)))))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(out_dir))
    return Path(out_dir)
