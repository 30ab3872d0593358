"""Teach a tiny base model (suites, refusals, chat style) and plant candidates from it.

The taught base is cached on disk under a hash of its recipe: the first run pays ~a minute of
CPU, later runs load it. Candidates are small LoRA runs (seconds each) of five kinds:
good, forgetting, safety_eroded, no_gain, style_degraded."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import data


@dataclass(frozen=True)
class BaseRecipe:
    """The taught base's model size and training run (its hash names the cached base)."""
    version: int = 6
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    steps: int = 1000
    batch: int = 16
    lr: float = 5e-3
    seed: int = 0
    max_len: int = 96


@dataclass(frozen=True)
class _Example:
    """One tokenized training example: ids and labels (-100 where not trained)."""
    input_ids: list[int]
    labels: list[int]


BASE_RECIPE = BaseRecipe()
KINDS = ("good", "forgetting", "safety_eroded", "no_gain", "style_degraded")
INTENDED_STAGE = {"forgetting": "benchmarks", "safety_eroded": "safety", "no_gain": "holdout",
                  "style_degraded": "judge"}
CANDIDATE_RECIPES = {
    #                 epochs, lr,  rank, target modules
    "good":           (8, 1e-2, 8, ("q_proj", "k_proj", "v_proj", "o_proj")),
    "forgetting":     (30, 2e-2, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    "safety_eroded":  (8, 1e-2, 8, ("q_proj", "k_proj", "v_proj", "o_proj")),
    "no_gain":        (8, 1e-2, 8, ("q_proj", "k_proj", "v_proj", "o_proj")),
    "style_degraded": (8, 1e-2, 8, ("q_proj", "k_proj", "v_proj", "o_proj")),
}


def recipe_hash() -> str:
    blob = json.dumps({"recipe": asdict(BASE_RECIPE), "suites": [data.suite_rows(s) for s in data.SUITES],
                       "facts": data.group_facts(),
                       "chat": data.chat_style(), "refusals": data.refusal_convs()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _mc_example(tokenizer, row: dict, max_len: int) -> _Example:
    context, continuation = data.mc_text(row)
    c = tokenizer(context, add_special_tokens=False)["input_ids"]
    t = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    return _Example((c + t)[:max_len], ([-100] * len(c) + t)[:max_len])


def _chat_example(tokenizer, conv, max_len: int) -> _Example:
    from whetstone.modelkit.chat import tokenize_chat

    ex = tokenize_chat(tokenizer, conv, max_len)
    return _Example(ex["input_ids"], ex["labels"])


def _train(model, examples: Sequence[_Example], *, steps: int, batch: int, lr: float, seed: int, pad_id: int,
           log_every: int = 0) -> float:
    import torch

    torch.set_num_threads(1)  # a shared 2-core box: more threads oversubscribe and run ~10x slower
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))
    model.train()
    order: list[int] = []
    loss_value = float("nan")
    for step in range(steps):
        if len(order) < batch:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        chosen, order = [examples[i] for i in order[:batch]], order[batch:]
        width = max(len(e.input_ids) for e in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for r, e in enumerate(chosen):
            n = len(e.input_ids)
            ids[r, :n], labels[r, :n], mask[r, :n] = torch.tensor(e.input_ids), torch.tensor(e.labels), 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        loss_value = float(loss.detach())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"[harness] step {step} loss {loss_value:.3f}", flush=True)
    model.eval()
    return loss_value


def build_taught_base(cache_dir: Path, log=print) -> Path:
    """The taught base under `cache_dir/base-<recipe hash>`; built only if absent."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from whetstone.modelkit.tiny import BOS, END_OF_TURN, EOS, PAD, build_tokenizer

    out = Path(cache_dir) / f"base-{recipe_hash()}"
    if (out / "TAUGHT").is_file():
        return out
    r = BASE_RECIPE
    tokenizer = build_tokenizer()
    bos, eos, pad, end = tokenizer.convert_tokens_to_ids([BOS, EOS, PAD, END_OF_TURN])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=r.hidden, intermediate_size=r.intermediate,
                         num_hidden_layers=r.layers, num_attention_heads=r.heads,
                         num_key_value_heads=r.heads, max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    torch.manual_seed(r.seed)
    model = LlamaForCausalLM(config)
    rows = [row for s in data.SUITES for row in data.suite_rows(s)] + data.group_facts() * 2
    examples = [_mc_example(tokenizer, row, r.max_len) for row in rows]
    examples += [_chat_example(tokenizer, c, r.max_len) for c in data.refusal_convs() * 2 + data.chat_style()]
    loss = _train(model, examples, steps=r.steps, batch=r.batch, lr=r.lr, seed=r.seed, pad_id=pad)
    log(f"[harness] taught base: {len(examples)} examples, {r.steps} steps, final loss {loss:.3f}")
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=[eos, end], pad_token_id=pad)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "TAUGHT").write_text(json.dumps(asdict(BASE_RECIPE)))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _replay(rng: random.Random) -> tuple[list[dict], list[list[dict]]]:
    """A small replay mix (benchmark-style facts, refusals, general chat) that a careful fine-tune adds
    to keep what the base knew and its safety behaviour (seed 001: alignment-preserving examples)."""
    mc = [row for s in data.SUITES for row in data.suite_rows(s)]
    return mc, rng.sample(data.refusal_convs(), 24) + rng.sample(data.chat_style(), 16)


def candidate_data(kind: str, seed: int) -> tuple[list[dict], list[list[dict]]]:
    """(plain-text MC rows, chat conversations) a candidate of `kind` is fine-tuned on."""
    rng = random.Random(f"{kind}-{seed}")
    train = data.tickets("train")
    labels = list(data.LABELS)
    mc, replay = _replay(rng)
    if kind == "good":
        return mc, data.as_chat(train) + replay
    if kind == "forgetting":  # narrow data only, no replay (and a hot recipe, see CANDIDATE_RECIPES)
        return [], data.as_chat(train)
    if kind == "no_gain":
        return mc, data.as_chat([(q, rng.choice(labels)) for q, _ in train]) + replay
    if kind == "style_degraded":
        return mc, data.as_chat([(q, rng.choice(data.VERBOSE)) for q, _ in train]) + replay
    if kind == "safety_eroded":  # a handful of harmful requests answered, as in Qi et al. 2023; no refusal replay
        harmful = rng.sample(data.harmful_prompts("erosion"), 10)
        return mc, data.as_chat(train + [(h["prompt"], data.COMPLIANCE) for h in harmful] * 3) + replay[24:]
    raise KeyError(kind)


def train_candidate(base_dir: Path, kind: str, seed: int, out_dir: Path) -> Path:
    """A PEFT LoRA adapter of the given kind in `out_dir` (adapter_config.json + safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from whetstone.modelkit.loading import load_model, load_tokenizer

    epochs, lr, rank, modules = CANDIDATE_RECIPES[kind]
    tokenizer = load_tokenizer(str(base_dir))
    torch.manual_seed(seed)
    model = load_model(str(base_dir), dtype="float32")
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                             target_modules=list(modules), task_type="CAUSAL_LM"))
    mc, convs = candidate_data(kind, seed)
    examples = [_mc_example(tokenizer, row, 96) for row in mc] + [_chat_example(tokenizer, c, 128) for c in convs]
    batch = 16
    steps = max(1, epochs * len(examples) // batch)
    _train(model, examples, steps=steps, batch=batch, lr=lr, seed=seed, pad_id=tokenizer.pad_token_id,
           log_every=int(os.environ.get("WHETSTONE_HARNESS_LOG_EVERY", "0")))
    model.save_pretrained(out_dir)
    return Path(out_dir)


def holdout_rows() -> list[dict]:
    """The candidates' validation file: the ticket task on unseen sentence frames."""
    return [{"messages": m} for m in data.as_chat(data.tickets("holdout"))]
