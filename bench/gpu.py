"""GPU benchmark: LoRA, QLoRA (NF4) and full fine-tuning of a randomly initialised ~1.1B Llama
with packed batches, on the first GPU this process sees (on a CPU-only machine: a tiny Llama on
the CPU, so CI proves the script works).

Nothing is downloaded: the model is a `LlamaConfig` (TinyLlama's shape: 22 layers, hidden 2048,
MLP 5632, 32 heads / 4 KV heads, vocab 32000) initialised at random and saved once to a local
directory, from which each method loads it as the platform would (QLoRA through
`BitsAndBytesConfig` NF4 with double quantisation; full fine-tuning with fp32 master weights;
LoRA on a bf16 base). Tokens are random ids (a Zipf-like distribution, so the loss can fall).

Packing as the platform does it on GPU: one row of `--tokens` tokens per micro-batch holding
many examples (log-normal lengths), `position_ids` restarting at 0 for each example, no
attention mask, the first label of each example masked. Attention (`--attention`):
- `platform` (default): the trainer-agent's `whetstone_varlen_sdpa` kernel, loaded from this
  repository's file (recipes/attention.py) without importing the whetstone packages: scaled
  dot-product attention once per example, causal, like flash-attention's varlen;
- `flash_attention_2`: transformers' varlen path (needs the flash-attn package);
- `sdpa`: stock sdpa, to which transformers gives a block-diagonal mask for packed rows.

Per method: 3 warm-up steps then 20 timed optimizer steps (`--warmup`, `--steps`), AdamW, bf16
autocast on GPU. Figures:
- tokens_per_s: real tokens (no padding exists in a packed row) / timed wall seconds;
- mfu = flops_per_token * tokens_per_s / peak, with N = parameters that do matmuls (all but the
  input embedding table, which is a lookup) and attention-score FLOPs not counted:
  full: 6 N per token (2 N forward, 2 N activation gradients, 2 N weight gradients);
  lora/qlora: 4 N + 6 N_lora per token (the frozen base computes no weight gradients;
  the adapters' own matmuls are counted in full; QLoRA's dequantisation is not useful work);
  peak = the GPU's dense bf16 tensor TFLOP/s (H100 SXM / H200: 989; `--peak-tflops` overrides);
- peak_memory_gib: torch.cuda.max_memory_allocated from loading the model to the last step;
- emergency_checkpoint_s: time to write the trainable state to local disk as the trainer-agent's
  SIGTERM checkpoint does (adapter or weights as safetensors, optimizer state, RNG), fsynced.
A method whose dependency is missing (bitsandbytes for QLoRA) is reported as skipped with the
reason; a method that fails (out of memory) is reported as failed; the run goes on.

    python3 bench/gpu.py                 # GPU if there is one, else the tiny CPU configuration
    python3 bench/gpu.py --tiny          # the tiny configuration (CPU unless --device cuda)
    python3 bench/gpu.py --methods lora,full --steps 10 --attention sdpa

Depends only on torch, transformers, peft and (optionally) bitsandbytes. Last line: JSON.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

METHODS = ("lora", "qlora", "full")
LEARNING_RATE = {"lora": 2e-4, "qlora": 2e-4, "full": 2e-5}  # the platform's defaults per method
PLATFORM_ATTENTION_FILE = (Path(__file__).resolve().parent.parent / "services" / "trainer-agent" / "src"
                           / "whetstone" / "trainer_agent" / "recipes" / "attention.py")

# dense bf16 tensor-core TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name; first match wins
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
                    ("H800", 989.0), ("B200", 2250.0), ("B100", 1750.0), ("A100", 312.0), ("A800", 312.0),
                    ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
                    ("RTX 4090", 165.0), ("A6000", 155.0))


@dataclass(frozen=True)
class Shape:
    """The model and the batch: the ~1.1B GPU configuration or the tiny CPU one."""
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tokens: int              # tokens per packed row = per optimizer step (one micro-batch)
    median_example: int      # median example length (log-normal, capped at `tokens`)
    lora_r: int              # the platform's rank for the size (RANK_BY_SIZE: 16 for 1-10B)


GPU_SHAPE = Shape("llama-1.1b", hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000,
                  tokens=16384, median_example=384, lora_r=16)
TINY_SHAPE = Shape("llama-tiny", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512,
                   tokens=256, median_example=24, lora_r=8)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ data


def packed_batch(shape: Shape, seed: int, device):
    """One packed row: examples of log-normal length back to back, positions restarting at 0."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < shape.tokens:
        draw = math.exp(math.log(shape.median_example) + 0.8 * float(torch.randn(1, generator=gen)))
        lengths.append(max(4, min(shape.tokens - sum(lengths), int(draw))))
    if lengths[-1] < 4 and len(lengths) > 1:  # a stub at the end joins the example before it
        lengths[-2] += lengths.pop()
    # Zipf-like token distribution: a model can learn it, so the loss falls when training works
    weights = 1.0 / torch.arange(1, shape.vocab + 1, dtype=torch.float64)
    input_ids = torch.multinomial(weights, shape.tokens, replacement=True, generator=gen)
    position_ids = torch.cat([torch.arange(n) for n in lengths])
    labels = input_ids.clone()
    labels[position_ids == 0] = -100  # no example learns to predict the next example's first token
    batch = {"input_ids": input_ids[None], "position_ids": position_ids[None], "labels": labels[None]}
    return {k: v.to(device) for k, v in batch.items()}, lengths


# ------------------------------------------------------------------ model


def llama_config(shape: Shape):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=max(4096, shape.tokens),
                       tie_word_embeddings=False, use_cache=False)


def write_random_base(shape: Shape, directory: Path, device, seed: int) -> None:
    """A randomly initialised Llama saved as safetensors (bf16), initialised on `device` (fast on a GPU)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape)).to(torch.bfloat16)
    model.save_pretrained(str(directory))
    del model


def attention_implementation(choice: str, device) -> str:
    """The attn_implementation name to load with; `platform` registers the trainer-agent's kernel."""
    if choice == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None or device.type != "cuda":
            raise SystemExit("--attention flash_attention_2 needs the flash-attn package and a CUDA device")
        return choice
    if choice == "sdpa":
        return choice
    if not PLATFORM_ATTENTION_FILE.is_file():
        raise SystemExit(f"--attention platform: {PLATFORM_ATTENTION_FILE} not found (run from a repository copy)")
    spec = importlib.util.spec_from_file_location("whetstone_recipe_attention", PLATFORM_ATTENTION_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.register()


class Skipped(Exception):
    """A method that cannot run here (a missing dependency): reported with the reason."""


def load_for_method(method: str, base_dir: Path, attn: str, device, shape: Shape):
    """(model ready to train, parameters it trains) for `method`, loaded as the platform loads it."""
    if method == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
        raise Skipped("bitsandbytes is not installed (QLoRA's NF4 weights need it)")
    import torch
    from transformers import AutoModelForCausalLM

    on_gpu = device.type == "cuda"
    kwargs = {"attn_implementation": attn}
    if method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if on_gpu else torch.float32)
        kwargs["device_map"] = {"": str(device) if not on_gpu else device.index or 0}
    # full fine-tuning keeps fp32 master weights (bf16 autocast on GPU); a frozen LoRA base is bf16 on GPU
    dtype = torch.float32 if method == "full" or not on_gpu else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype, **kwargs)
    if method != "qlora":
        model.to(device)
    model.config.use_cache = False
    if method == "full":
        model.train()
        return model
    from peft import LoraConfig, get_peft_model

    if method == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(r=shape.lora_r, lora_alpha=2 * shape.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    model.train()
    return model


def nf4_layers(model) -> int:
    """Linear layers whose weights really are 4-bit NF4 (read back from the bitsandbytes modules)."""
    import bitsandbytes as bnb

    return sum(1 for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)
               and getattr(m.weight, "quant_state", None) is not None and m.weight.quant_state.quant_type == "nf4")


def matmul_parameters(shape: Shape) -> int:
    """Parameters that take part in matmuls: every linear layer and the output head (the input
    embedding is a lookup, the norms are elementwise)."""
    attn = shape.hidden * shape.hidden * 2 + shape.hidden * (shape.hidden // shape.heads) * shape.kv_heads * 2
    mlp = 3 * shape.hidden * shape.intermediate
    return shape.layers * (attn + mlp) + shape.hidden * shape.vocab


def total_parameters(shape: Shape) -> int:
    norms = (2 * shape.layers + 1) * shape.hidden
    return matmul_parameters(shape) + shape.vocab * shape.hidden + norms


def flops_per_token(method: str, shape: Shape, lora_parameters: int) -> int:
    n = matmul_parameters(shape)
    return 6 * n if method == "full" else 4 * n + 6 * lora_parameters


def peak_tflops(device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--peak-tflops"
    if device.type != "cuda":
        return None, "no GPU: MFU is not reported on the CPU"
    import torch

    name = torch.cuda.get_device_name(device)
    for part, tflops in PEAK_BF16_TFLOPS:
        if part in name:
            return tflops, f"dense bf16 of {part}"
    return None, f"unknown GPU {name!r}: pass --peak-tflops"


# ------------------------------------------------------------------ one method


def emergency_checkpoint(model, optimizer, directory: Path, method: str) -> tuple[float, int]:
    """Write the trainable state as the agent's SIGTERM checkpoint does; (seconds, bytes)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    directory.mkdir(parents=True)
    model.save_pretrained(str(directory), safe_serialization=True)  # a PEFT model writes only its adapter
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    rng = {"python_torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available()
           else []}
    torch.save(rng, directory / "rng_state.pth")
    (directory / "trainer_state.json").write_text(json.dumps({"method": method, "kind": "emergency"}))
    size = 0
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            size += path.stat().st_size
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return time.perf_counter() - start, size


def run_method(method: str, args, shape: Shape, base_dir: Path, attn: str, device, peak: float | None,
               work: Path) -> dict:
    import torch

    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(args.seed)
    model = load_for_method(method, base_dir, attn, device, shape)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE[method], weight_decay=0.0,
                                  **({"fused": True} if on_gpu else {}))
    batches = [packed_batch(shape, args.seed + i, device) for i in range(2)]  # alternate two rows
    losses: list[float] = []
    step_times: list[float] = []

    def step(i: int) -> float:
        batch, _ = batches[i % len(batches)]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=on_gpu):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for i in range(args.warmup):
        losses.append(float(step(i)))
    if on_gpu:
        torch.cuda.synchronize()
    timed = []
    start = time.perf_counter()
    for i in range(args.steps):
        t = time.perf_counter()
        timed.append(step(args.warmup + i))
        if args.sync_each_step and on_gpu:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t)
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    losses += [float(x) for x in timed]
    if not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"{method}: loss not finite: {losses}")
    tokens_per_s = args.steps * shape.tokens / elapsed
    lora_params = n_trainable if method != "full" else 0
    fpt = flops_per_token(method, shape, lora_params)
    peak_mem = torch.cuda.max_memory_allocated(device) if on_gpu else None
    seconds, size = emergency_checkpoint(model, optimizer, work / f"checkpoint-{method}", method)
    shutil.rmtree(work / f"checkpoint-{method}", ignore_errors=True)
    result = {
        "status": "ok",
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(fpt * tokens_per_s / (peak * 1e12), 4) if peak else None,
        "flops_per_token": fpt,
        "achieved_tflops": round(fpt * tokens_per_s / 1e12, 2),
        "peak_memory_gib": round(peak_mem / 2**30, 2) if peak_mem is not None else None,
        "emergency_checkpoint_s": round(seconds, 3),
        "emergency_checkpoint_bytes": size,
        "trainable_parameters": n_trainable,
        "nf4_layers": nf4_layers(model) if method == "qlora" else None,
        "learning_rate": LEARNING_RATE[method],
        "step_s_median": round(sorted(step_times)[len(step_times) // 2], 4),
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
    }
    del model, optimizer, batches
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return result


def run_with_retries(method: str, args, shape: Shape, base_dir: Path, attn: str, device, peak: float | None,
                     work: Path) -> dict:
    """One method's result; out of memory halves the packed row (as the platform halves its micro-batch)
    up to twice; a missing dependency is a skip and any other error a failure, named in the result."""
    import torch

    halvings: list[str] = []
    while True:
        try:
            result = run_method(method, args, shape, base_dir, attn, device, peak, work)
            result["tokens_per_step"] = shape.tokens
            if halvings:
                result["out_of_memory_at"] = halvings
            return result
        except Skipped as exc:
            return {"status": "skipped", "reason": str(exc)}
        except Exception as exc:  # out of memory, a kernel error: named, and the next method runs
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if isinstance(exc, torch.OutOfMemoryError) and len(halvings) < 2 and shape.tokens >= 2048:
                halvings.append(f"{shape.tokens} tokens")
                log(f"  {method}: out of memory at {shape.tokens} tokens per step; retrying with {shape.tokens // 2}")
                shape = Shape(**{**shape.__dict__, "tokens": shape.tokens // 2})
                continue
            return {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                    **({"out_of_memory_at": halvings} if halvings else {})}


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tiny Llama (also chosen when no GPU is found)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda:0 when there is a GPU)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of lora,qlora,full")
    p.add_argument("--attention", choices=("platform", "flash_attention_2", "sdpa"), default="platform")
    p.add_argument("--steps", type=int, default=None, help="timed optimizer steps (default 20; tiny: 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; tiny: 1)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per packed row / step (default 16384)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    p.add_argument("--work-dir", default=None, help="local disk for the base model and the checkpoints")
    p.add_argument("--sync-each-step", action="store_true", help="synchronize after each step (step times exact)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        p.error(f"--methods: unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    return args


def versions() -> dict:
    import peft
    import torch
    import transformers

    bnb = None
    if importlib.util.find_spec("bitsandbytes") is not None:
        from importlib.metadata import version

        bnb = version("bitsandbytes")
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "peft": peft.__version__, "bitsandbytes": bnb}


def main(argv: list[str] | None = None) -> dict:
    import torch

    args = parse_args(argv)
    began = time.perf_counter()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = torch.device(args.device or ("cuda:0" if torch.cuda.is_available() and not args.tiny else "cpu"))
    tiny = args.tiny or device.type != "cuda"
    shape = TINY_SHAPE if tiny else GPU_SHAPE
    if args.tokens:
        shape = Shape(**{**shape.__dict__, "tokens": args.tokens})
    args.steps = args.steps if args.steps is not None else (3 if tiny else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 3)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    peak, peak_source = peak_tflops(device, args.peak_tflops)
    attn = attention_implementation(args.attention, device)
    work = Path(tempfile.mkdtemp(prefix="whetstone-bench-gpu-", dir=args.work_dir))
    _, lengths = packed_batch(shape, args.seed, "cpu")
    report: dict = {
        "bench": "gpu",
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "gpus_found": torch.cuda.device_count(),
        "gpus_used": 1 if device.type == "cuda" else 0,
        "peak_bf16_tflops": peak,
        "peak_source": peak_source,
        "versions": versions(),
        "model": {"shape": shape.name, "parameters": total_parameters(shape),
                  "matmul_parameters": matmul_parameters(shape), "layers": shape.layers, "hidden": shape.hidden,
                  "vocab": shape.vocab, "lora_r": shape.lora_r},
        "attention": attn,
        "packing": {"tokens_per_step": shape.tokens, "examples_per_row": len(lengths),
                    "mean_example_tokens": round(shape.tokens / len(lengths), 1), "padding_tokens": 0},
        "steps": {"warmup": args.warmup, "timed": args.steps},
        "mfu_formula": "flops_per_token * tokens_per_s / peak; full: 6N; lora/qlora: 4N + 6N_lora; "
                       "N = matmul parameters (no input embedding), attention scores not counted",
        "methods": {},
    }
    try:
        log(f"bench-gpu: {shape.name} on {device} ({report['gpu'] or 'cpu'}), attention {attn}")
        base_dir = work / "base"
        t = time.perf_counter()
        write_random_base(shape, base_dir, device, args.seed)
        report["base_model_write_s"] = round(time.perf_counter() - t, 2)
        for method in args.methods.split(","):
            t = time.perf_counter()
            result = run_with_retries(method, args, shape, base_dir, attn, device, peak, work)
            result["wall_s"] = round(time.perf_counter() - t, 2)
            report["methods"][method] = result
            log(f"  {method}: {json.dumps(result)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["wall_s"] = round(time.perf_counter() - began, 2)
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
