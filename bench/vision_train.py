"""Vision benchmark, training half: the tiny LLaVA learns "what colour is the shape?" on this CPU.

The examples are bench/vision.py's generated pictures (a circle, square or triangle in one of 6 colours on a
noisy background), good ones only. The job runs through the trainer agent's vision recipe as the agent runs
it (`whetstone.devstack.recipe_harness.run_in_process`: the same CONFIG, events, checkpoints), LoRA on the language model;
then base and candidate answer each held-out picture greedily (the processor lays out the prompt and the
image), and the first word of the answer is scored against the colour. Text alone cannot solve it: every
question is the same sentence, so a blind model is at chance (1/6) at best.

    .venv/bin/python bench/vision_train.py [--train 600] [--heldout 120] [--epochs 3] [--seed S]

Target: accuracy_candidate >= 0.9 with the base near chance. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vision import COLOURS, QUESTION, data_url, encode, picture  # noqa: E402
from whetstone.devstack.recipe_harness import run_in_process, write_jsonl  # noqa: E402
from whetstone.trainer_agent.domain.recipe_io import Checkpoint, Completed  # noqa: E402

DEBUG = False


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        im, colour, _ = picture(rng)
        url = data_url(encode(im, "PNG"), "image/png")
        out.append({"messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                              {"type": "image_url", "image_url": {"url": url}}]},
                                 {"role": "assistant", "content": colour}]})
    return out


def accuracy(model, processor, heldout: list[dict]) -> float:
    """Share of held-out pictures whose greedy answer's first word is the colour."""
    import torch
    from whetstone.modelkit.vision import open_image

    model.eval()
    right = 0
    for r in heldout:
        user, answer = r["messages"][0], r["messages"][1]["content"]
        prompt = processor.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
        image = open_image(user["content"][1]["image_url"]["url"])
        inputs = processor(text=prompt, images=[image], return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        text = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        words = text.strip().lower().split()
        if DEBUG:
            print(repr(text), answer, file=sys.stderr)
        right += bool(words) and words[0].strip(".,") == answer
    return right / len(heldout)


def train_and_score(work: Path, *, train: int, heldout: int, epochs: int, seed: int,
                    train_vision_tower: bool = False) -> dict:
    from peft import PeftModel
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model
    from whetstone.modelkit.vision import load_processor, load_vision_model

    base = build_tiny_vision_model(work / "tiny-llava", seed=0)
    train_file = write_jsonl(rows(train, seed), work / "train.jsonl")
    held = rows(heldout, seed + 1)
    config = {"job_id": "bench-vision", "base_model": str(base), "train_file": str(train_file),
              "output_dir": str(work / "out"), "method": "lora",
              "hyperparameters": {"n_epochs": epochs, "learning_rate": 3e-3, "batch_size": 8, "lora_r": 16,
                                  "lora_alpha": 32, "max_seq_len": 128, "seed": seed, "warmup_ratio": 0.05,
                                  "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0,
                                  "train_vision_tower": train_vision_tower}}
    t = time.perf_counter()
    run = run_in_process(config, work)
    train_s = time.perf_counter() - t
    if not isinstance(run.last, Completed):
        raise SystemExit(f"training failed: {run.last}")
    processor = load_processor(base)
    accuracy_base = accuracy(load_vision_model(base), processor, held)
    final = run.of(Checkpoint)[-1].path
    candidate = PeftModel.from_pretrained(load_vision_model(base), final)
    losses = run.losses()
    return {"accuracy_base": round(accuracy_base, 4), "accuracy_candidate": round(accuracy(candidate, processor, held), 4),
            "chance": round(1 / len(COLOURS), 4), "train_examples": train, "heldout_examples": heldout,
            "epochs": epochs, "steps": run.completed.step, "train_s": round(train_s, 1),
            "first_loss": round(losses[min(losses)], 4), "last_loss": round(losses[max(losses)], 4),
            "vision_tower": "lora" if train_vision_tower else "frozen"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=600)
    ap.add_argument("--heldout", type=int, default=120)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--train-vision-tower", action="store_true")
    ap.add_argument("--debug", action="store_true", help="print each held-out answer to stderr")
    args = ap.parse_args(argv)
    global DEBUG
    DEBUG = args.debug
    with tempfile.TemporaryDirectory(prefix="bench-vision-train-") as tmp:
        out = train_and_score(Path(tmp), train=args.train, heldout=args.heldout, epochs=args.epochs, seed=args.seed,
                              train_vision_tower=args.train_vision_tower)
    out["targets_met"] = {"accuracy_candidate": out["accuracy_candidate"] >= 0.9}
    print(json.dumps(out))
    return 0 if out["targets_met"]["accuracy_candidate"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
