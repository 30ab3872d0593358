"""A tiny, random-init Llama + locally trained byte-level BPE tokenizer.

Nothing can be downloaded in tests or in `make demo`, so the platform builds its own
"base model": same file layout and loading path as a real Hub checkpoint
(`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`,
`chat_template.jinja`, `generation_config.json`), just small and random.

The chat template deliberately has NO `{% generation %}` markers, like most real base
models, so the platform's own assistant masking (`whetstone.modelkit.chat`) is exercised.

    python -m whetstone.modelkit.tiny OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS, END_OF_TURN]
TARGET_VOCAB_SIZE = 1536

# ChatML-like, one header token per role, <|end|> closes every turn. No generation markers.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('Unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# A tool-capable template in the style of real ones: tools in a system block, tool results as their
# own turn, an assistant turn renders its calls as name + JSON arguments (tests of tool rendering and masks).
TOOL_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}{{- '<|system|>\\n' + (tools | tojson) + '<|end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}{{- '<|user|>\\n' + message['content'] + '<|end|>\\n' -}}"
    "{%- elif message.get('tool_calls') -%}{{- '<|assistant|>\\n' + message['content'] -}}"
    "{%- for c in message['tool_calls'] -%}{{- c['function']['name'] + (c['function']['arguments'] | tojson) -}}"
    "{%- endfor -%}{{- '<|end|>\\n' -}}"
    "{%- else -%}{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# Small built-in corpus: enough English, digits, punctuation and chat phrasing for BPE
# merges to be meaningful. Byte-level BPE still encodes ANY text (unknown words fall
# back to bytes), so data outside this corpus only costs more tokens.
_PROSE = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Machine learning models learn patterns from data. Fine-tuning adapts a pretrained model to a new task.
A language model predicts the next token given the previous tokens. Training minimizes the loss.
The capital of a country is the city where its government sits. Rivers flow into the sea.
Water boils at one hundred degrees Celsius at sea level. The sun rises in the east and sets in the west.
Please answer the question briefly and politely. Thank you for your help! You are welcome.
Hello, how can I help you today? I am a helpful assistant. Could you explain that again, please?
Sure, here is the answer. The result is correct. Let me think step by step about this problem.
Summarize the following text in one sentence. Translate the sentence into French. Write a short poem.
What is your name? My name is Ada. Where do you live? I live in a small house near the river.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.
January February March April May June July August September October November December.
Red, orange, yellow, green, blue, indigo and violet are the colours of the rainbow.
"""
_COUNTRIES = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Canada", "Ottawa"), ("Brazil", "Brasilia"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"),
    ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Greece", "Athens"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Mexico", "Mexico City"), ("Australia", "Canberra"),
]
_WORDS = "apple banana cherry river mountain forest cloud stone paper garden window music yellow purple".split()
_QUESTIONS = ["What is", "Who is", "Where is", "How do I", "Can you", "Why does", "Tell me", "Explain"]


def _corpus() -> list[str]:
    """Deterministic training text for the tokenizer (no randomness, no I/O)."""
    lines = [line for line in _PROSE.splitlines() if line]
    for country, capital in _COUNTRIES:
        lines.append(f"What is the capital of {country}? The capital of {country} is {capital}.")
    for a, b in itertools.product(range(0, 20), range(0, 20)):
        lines.append(f"What is {a} + {b}? {a} + {b} = {a + b}. {a} times {b} is {a * b}.")
    for w1, w2 in itertools.permutations(_WORDS, 2):
        lines.append(f"Repeat after me: {w1} {w2}. {w1} {w2}")
    for q, w in itertools.product(_QUESTIONS, _WORDS):
        lines.append(f"{q} the {w}? Here is a short answer about the {w}.")
    chat = []
    for line in lines[:40]:
        chat.append(f"{BOS}<|system|>\nYou are a helpful assistant.{END_OF_TURN}\n<|user|>\n{line}{END_OF_TURN}\n")
        chat.append(f"<|assistant|>\n{line}{END_OF_TURN}\n")
    return lines + chat


def build_tokenizer():
    """Train a byte-level BPE on the built-in corpus; return a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=[*ROLE_TOKENS, END_OF_TURN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def tiny_llama_config(*, vocab_size: int, bos_id: int, eos_id: int, pad_id: int):
    """The tiny Llama's config: 2 layers, hidden 64, 4 heads, 1024 positions."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        # Wide init on purpose: with the usual 0.02, the frozen lm_head (64 -> V) caps logit
        # gaps at about one nat, so no adapter could ever fit the data well. 0.2 gives the
        # random "base model" a realistic logit range for LoRA to exploit.
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def write_tiny_model(model_class, config, processing, out_dir: Path, *, seed: int, bos_id: int, eos_id: int,
                     end_id: int, pad_id: int) -> Path:
    """`model_class(config)` initialised from `seed` (the global RNG left as it was), generating until EOS
    or the end of a turn, saved with its tokenizer or processor (`processing`) to `out_dir`."""
    import torch
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=[eos_id, end_id], pad_token_id=pad_id
    )
    model.save_pretrained(out_dir)  # safetensors
    processing.save_pretrained(out_dir)
    return out_dir


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny random Llama + tokenizer to `out_dir`; same seed -> same bytes."""
    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    bos_id, eos_id, pad_id, end_id = tokenizer.convert_tokens_to_ids([BOS, EOS, PAD, END_OF_TURN])
    config = tiny_llama_config(vocab_size=len(tokenizer), bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    return write_tiny_model(LlamaForCausalLM, config, tokenizer, out_dir, seed=seed, bos_id=bos_id,
                            eos_id=eos_id, end_id=end_id, pad_id=pad_id)


def build_cli(argv: list[str] | None, *, prog: str, doc: str, what: str,
              build: Callable[..., Path]) -> int:
    """`python -m <prog> OUT_DIR [--seed N]`: build into OUT_DIR, print its path (timing on stderr)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    path = build(args.out_dir, seed=args.seed)
    print(f"{what} written to {path.resolve()} in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    print(path.resolve())
    return 0


def main(argv: list[str] | None = None) -> int:
    return build_cli(argv, prog="python -m whetstone.modelkit.tiny", doc=__doc__, what="tiny model",
                     build=build_tiny_model)


if __name__ == "__main__":
    raise SystemExit(main())
