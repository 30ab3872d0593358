"""The gathered multi-LoRA forward against PEFT itself: same logits as PEFT's mixed-batch
inference (`adapter_names=`, "__base__" for rows without adapter) on the tiny Llama."""

import pytest

pytestmark = pytest.mark.integration


def test_mixed_batch_matches_peft_adapter_names(tiny_base, sample_adapters):
    import torch
    from peft import PeftModel

    from whetstone.modelkit.loading import load_model
    from whetstone.serving.adapters.engine import GenRow, LoraEngine

    engine = LoraEngine(tiny_base, slots=2, max_rank=16)
    for i in (0, 1):
        engine.load(f"a{i}", engine.read(sample_adapters[i]))
    ref = PeftModel.from_pretrained(load_model(tiny_base, dtype="float32"), str(sample_adapters[0]), adapter_name="a0")
    ref.load_adapter(str(sample_adapters[1]), adapter_name="a1")
    ref.eval()
    ids = torch.tensor([engine.encode("The capital of France is")] * 3)
    with torch.inference_mode():
        want = ref(input_ids=ids, adapter_names=["a0", "a1", "__base__"]).logits
        engine.lora.use([engine.adapters["a0"], engine.adapters["a1"], 0])
        got = engine.model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(got[0], got[1], atol=1e-2)  # the rows really took different weights

    # generation: a mixed batch gives each row what a batch of its adapter alone gives
    def run(names, mixed, stream=True):
        out = {}
        rows = [GenRow(adapter=n, prompt_ids=list(ids[0]), max_tokens=6, temperature=0, stream=stream,
                       emit=lambda d, f, k=k: out.__setitem__(k, out.get(k, "") + d)) for k, n in enumerate(names)]
        engine.generate(rows, mixed=mixed)
        return [out.get(k, "") for k in range(len(names))]

    mixed = run(["a0", "a1", "a0"], True)
    assert mixed == [run(["a0"], False)[0], run(["a1"], False)[0], run(["a0"], False)[0]]
    assert run(["a0", "a1", "a0"], True, stream=False) == mixed  # decoded once at the end: the same text
    with pytest.raises(ValueError):
        run(["a0", "a1"], False)
    slot = engine.adapters["a0"]
    with torch.inference_mode():  # the gathered weights of these rows are kept between passes...
        engine.lora.use([slot])
        engine.model(input_ids=ids[:1])
    engine.unload("a0")
    assert "a0" not in engine.adapters and engine.lora.users["model.layers.0.self_attn.q_proj"] == 1
    engine.load("b", engine.read(sample_adapters[1]))
    assert engine.adapters["b"] == slot
    with torch.inference_mode():  # ...but a slot given other weights is gathered again
        engine.lora.use([slot])
        assert torch.allclose(engine.model(input_ids=ids[:1]).logits, want[1:2], atol=1e-4)


def test_rows_joining_mid_generation_answer_as_if_alone(tiny_base, sample_adapters):
    """Continuous batching: rows admitted between decode steps (other prompt lengths, other
    adapters) and rows leaving early give the same greedy text as each row generated alone."""
    from whetstone.serving.adapters.engine import GenRow, LoraEngine, RunningBatch

    engine = LoraEngine(tiny_base, slots=3, max_rank=16)
    for i in (0, 1, 2):
        engine.load(f"a{i}", engine.read(sample_adapters[i]))
    prompts = [engine.encode("The capital of France is"), engine.encode("Hi"),
               engine.encode("Once upon a time, in a land far away, there lived"), engine.encode("2 + 2 =")]
    specs = [("a0", prompts[0], 8), ("a1", prompts[1], 3), ("a2", prompts[2], 6), ("a0", prompts[3], 5)]

    def rows(out):
        return [GenRow(adapter=a, prompt_ids=p, max_tokens=m, temperature=0,
                       emit=lambda d, f, k=k: out.__setitem__(k, out.get(k, "") + d + (f"|{f}" if f else "")))
                for k, (a, p, m) in enumerate(specs)]

    alone: dict[int, str] = {}
    for k, row in enumerate(rows(alone)):
        engine.generate([row], mixed=False)
    together: dict[int, str] = {}
    batch, pending = RunningBatch(engine), rows(together)
    batch.admit(pending[:1])
    batch.step()
    batch.admit(pending[1:3])  # join a running row: shorter and longer prompts, other adapters
    widths = []
    while batch.rows:
        batch.step()
        widths.append((len(batch.rows), batch.attn.shape[1] if batch.rows else 0))
        if len(widths) == 2:
            batch.admit(pending[3:])
    assert together == alone and all(v.endswith(("|length", "|stop")) for v in alone.values())
    # rows left the batch while others went on
    assert any(n < 3 for n, _ in widths)
    assert batch.cache is None
