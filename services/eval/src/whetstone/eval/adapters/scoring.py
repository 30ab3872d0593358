"""Holdout loss / perplexity of the base model and of base + adapter (torch lives here)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from whetstone.runtime.s3 import ObjectStore


def read_rows(path: Path, limit: int) -> list[list[dict]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line)["messages"])
            if len(rows) >= limit:
                break
    return rows


def score(store: ObjectStore, base_model: str, adapter_uri: str, manifest_sha256: str, holdout_uri: str,
          max_rows: int, max_len: int) -> dict[str, dict[str, float]]:
    import torch  # noqa: PLC0415
    from peft import PeftModel  # noqa: PLC0415

    from whetstone.modelkit.holdout import holdout_loss  # noqa: PLC0415
    from whetstone.modelkit.loading import load_model, load_tokenizer  # noqa: PLC0415
    from whetstone.runtime.checkpoints import download_checkpoint  # noqa: PLC0415

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="eval-") as tmp:
        adapter_dir = Path(tmp) / "adapter"
        download_checkpoint(store, adapter_uri, adapter_dir, manifest_sha256)
        holdout = store.download_file(holdout_uri, Path(tmp) / "holdout.jsonl")
        rows = read_rows(holdout, max_rows)
        tokenizer = load_tokenizer(base_model)
        model = load_model(base_model)
        model.eval()
        base = holdout_loss(model, tokenizer, rows, max_len=max_len)
        tuned = PeftModel.from_pretrained(model, str(adapter_dir))
        tuned.eval()
        candidate = holdout_loss(tuned, tokenizer, rows, max_len=max_len)
    return {"base": base, "candidate": candidate, "rows": {"n": len(rows)}}
