"""Generate `chat_demo.jsonl`: small, synthetic, learnable chat SFT data.

Deterministic for a given seed; every row is distinct. Four templated tasks a LoRA on a tiny random model can
pick up in about one epoch: capital-city facts, one-digit addition, echoing words back,
and a reply to a greeting. Some rows carry a system prompt, some have two turns.

    python examples/datasets/make_chat_demo.py                      # writes chat_demo.jsonl (240 rows)
    python examples/datasets/make_chat_demo.py --rows 40 --seed 7 --out /tmp/holdout.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM_PROMPT = "You are a helpful assistant."
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "Canada": "Ottawa",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Norway": "Oslo", "Sweden": "Stockholm",
    "Poland": "Warsaw", "Greece": "Athens", "Peru": "Lima", "Chile": "Santiago",
}
WORDS = ["apple", "banana", "cherry", "river", "mountain", "forest", "cloud", "stone",
         "paper", "garden", "window", "music", "yellow", "purple", "green", "blue"]
# each greeting gets its own reply: rows that differ only in the greeting would be near-duplicates
GREETINGS = {"Hello!": "Hello! How can I help you today?", "Hi there!": "Hi! What can I do for you?",
             "Good morning!": "Good morning to you. What do you need?", "Hey!": "Hey, nice to see you.",
             "Hello, assistant.": "Hello, user. Ask me anything."}


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."


def _addition(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."


def _echo(rng: random.Random) -> tuple[str, str]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
    return f"Repeat after me: {words}", words


def _greeting(rng: random.Random) -> tuple[str, str]:
    greeting = rng.choice(sorted(GREETINGS))
    return greeting, GREETINGS[greeting]


TASKS = (_capital, _addition, _echo, _greeting)


def make_row(rng: random.Random) -> dict:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": SYSTEM_PROMPT})
    for _ in range(1 if rng.random() < 0.8 else 2):
        question, answer = rng.choice(TASKS)(rng)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages}


def generate_rows(n: int = 240, seed: int = 0) -> list[dict]:
    """`n` distinct rows: a row drawn twice is drawn again (the ingest gate would drop the copy)."""
    rng = random.Random(seed)
    rows: dict[str, dict] = {}
    for _ in range(n * 100):
        if len(rows) == n:
            break
        row = make_row(rng)
        rows.setdefault(json.dumps(row, sort_keys=True), row)
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} distinct rows could be drawn; ask for fewer")
    return list(rows.values())


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the synthetic chat SFT demo dataset.")
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("chat_demo.jsonl"))
    args = parser.parse_args(argv)
    print(write_jsonl(generate_rows(args.rows, args.seed), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
