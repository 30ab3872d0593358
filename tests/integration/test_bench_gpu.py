"""`make bench-gpu` on a machine without a GPU: the tiny configuration trains LoRA, QLoRA (NF4 on the
CPU) and full fine-tuning with packed rows through the platform's attention kernel, reports every
figure as JSON on its last line, and never imports the whetstone packages (the GPU machine runs it
from a bare repository copy)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"

RUN_BARE = """
import runpy, sys
sys.argv = [sys.argv[1], "--tiny", "--steps", "2", "--warmup", "0"]
runpy.run_path(sys.argv[0], run_name="__main__")
leaked = sorted(m for m in sys.modules if m == "whetstone" or m.startswith("whetstone."))
assert not leaked, f"bench/gpu.py imported whetstone packages: {leaked}"
"""


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_tiny_cpu_run_reports_every_method(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN_BARE, str(BENCH)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["device"] == "cpu" and report["model"]["shape"] == "llama-tiny"
    assert report["attention"] == "whetstone_varlen_sdpa"
    assert report["packing"]["examples_per_row"] > 1 and report["packing"]["padding_tokens"] == 0
    methods = report["methods"]
    assert list(methods) == ["lora", "qlora", "full"]
    for name, result in methods.items():
        assert result["status"] == "ok", (name, result)
        assert result["tokens_per_s"] > 0 and result["tokens_per_step"] == report["packing"]["tokens_per_step"]
        assert result["emergency_checkpoint_s"] > 0 and result["emergency_checkpoint_bytes"] > 0
        assert result["mfu"] is None  # no peak is known for a CPU
    n = report["model"]["matmul_parameters"]
    assert methods["full"]["trainable_parameters"] == report["model"]["parameters"]
    assert methods["full"]["flops_per_token"] == 6 * n
    lora = methods["lora"]["trainable_parameters"]
    assert 0 < lora < n / 4
    assert methods["lora"]["flops_per_token"] == 4 * n + 6 * lora
    assert methods["qlora"]["nf4_layers"] == 7 * report["model"]["layers"]  # q k v o gate up down
    # the full run checkpoints weights and optimizer state: far more bytes than an adapter's
    assert methods["full"]["emergency_checkpoint_bytes"] > 3 * methods["lora"]["emergency_checkpoint_bytes"]


def test_missing_bitsandbytes_is_a_skip_not_a_crash(monkeypatch, tmp_path):
    import torch

    bench = load_bench()
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # find_spec answers None: as if not installed
    args = bench.parse_args(["--tiny", "--methods", "qlora"])
    result = bench.run_with_retries("qlora", args, bench.TINY_SHAPE, tmp_path / "base", "sdpa", torch.device("cpu"),
                                    None, tmp_path)
    assert result == {"status": "skipped", "reason": "bitsandbytes is not installed (QLoRA's NF4 weights need it)"}


def test_mfu_counts_and_peaks():
    bench = load_bench()
    shape = bench.GPU_SHAPE
    assert 1.0e9 < bench.total_parameters(shape) < 1.2e9  # the ~1.1B TinyLlama shape
    assert bench.flops_per_token("full", shape, 0) == 6 * bench.matmul_parameters(shape)
    assert dict(bench.PEAK_BF16_TFLOPS)["H100"] == 989.0 and dict(bench.PEAK_BF16_TFLOPS)["H200"] == 989.0
