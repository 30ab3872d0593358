"""Vision fine-tuning end to end through the real platform with the official `openai` client, unchanged
(issue 37 point 6): an image-and-text chat JSONL uploaded with purpose "fine-tune" (and a held-out one as
the validation file), a supervised job on the tiny vision base (`whet models create-tiny --vision`), and a
chat completion with an image part answered by the fine-tuned model, all through the public gateway on the
embedded stack. The job keeps the DEFAULT eval settings (issue 37 point 4): benchmarks on the language
side, holdout loss and exact answers on the held-out pictures vs the base, safety on the language side;
the safety set is cut to the first 4 shipped prompts (all 48 took 5.5 minutes on a loaded 2-core
machine). Tiny sizes: 32 rows of 8 x 8 pictures, three epochs of four steps at a high learning rate (the
random base must learn the colours well enough for the holdout stage to vouch for it), a LoRA of rank 8."""

import asyncio
import base64
import io
import json
from pathlib import Path

import openai
import pytest
import whetstone.eval
from PIL import Image

from whetstone.cli.dev import core_service_builders, upstreams_of
from whetstone.devstack.testing import until

pytestmark = pytest.mark.integration
TERMINAL = ("succeeded", "failed", "cancelled")
BASE = "tiny-llava"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "white": (250, 250, 250)}
SHIPPED_SAFETY = Path(whetstone.eval.__file__).parent / "suites" / "safety" / "harmful_prompts.jsonl"
FAST = {"n_epochs": 6, "batch_size": 8, "learning_rate_multiplier": 100, "max_seq_len": 64, "lora_r": 8}


def picture(rgb: tuple[int, int, int]) -> dict:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), rgb).save(buf, "PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def vision_file(first: int = 0, n: int = 32) -> bytes:
    rows = []
    for i in range(first, first + n):
        name = list(COLOURS)[i % len(COLOURS)]
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "text", "text": f"Picture {i}: which colour?"}, picture(COLOURS[name])]},
            {"role": "assistant", "content": name}]})
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def test_openai_client_trains_a_vision_adapter_and_chats_with_an_image(platform, settings, openai_clients,
                                                                            monkeypatch):
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model
    from whetstone.serving.bootstrap import build_service as serving

    await asyncio.to_thread(build_tiny_vision_model, Path(settings.model_catalog) / BASE)
    monkeypatch.setenv("WHETSTONE_SERVING_BASE_MODEL", BASE)
    prompts = Path(settings.data_dir) / "safety-prompts.jsonl"
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(SHIPPED_SAFETY.read_text().splitlines(keepends=True)[:4]))
    monkeypatch.setenv("WHETSTONE_EVAL_SAFETY_PROMPTS", str(prompts))
    async with platform(*core_service_builders(), serving) as p:
        async with openai_clients(upstreams_of(p.runtimes.values())) as (client, _other):
            f = await client.files.create(file=("pictures.jsonl", vision_file()), purpose="fine-tune")
            f = await until(lambda: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 120,
                            "validation of the image file")
            assert f.status == "processed", f.model_extra
            v = await client.files.create(file=("held-out.jsonl", vision_file(first=100, n=16)), purpose="fine-tune")
            v = await until(lambda: client.files.retrieve(v.id), lambda x: x.status != "uploaded", 120,
                            "validation of the held-out image file")
            assert v.status == "processed", v.model_extra
            job = await client.fine_tuning.jobs.create(
                model=BASE, training_file=f.id, validation_file=v.id, suffix="colours",
                method={"type": "supervised", "supervised": {"hyperparameters": FAST}})
            job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status in TERMINAL, 600,
                              f"job {job.id}")
            assert job.status == "succeeded", job
            job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.fine_tuned_model, 120,
                              "fine_tuned_model")
            model = await client.models.retrieve(job.fine_tuned_model)
            vision = model.model_extra["lineage"]["vision"]
            assert vision["processor_class"] == "LlavaProcessor" and vision["vision_tower"] == "frozen"
            question = [{"role": "user", "content": [{"type": "text", "text": "Picture 99: which colour?"},
                                                     picture(COLOURS["red"])]}]
            stages = {s["name"]: s for s in model.model_extra["lineage"]["eval_stages"]}
            assert model.model_extra["stage"] in ("staging", "production"), stages
            assert stages["holdout"]["status"] == "passed", stages       # held-out pictures, vs the base
            assert stages["benchmarks"]["details"]["suites"], stages      # measured on the language side
            # the download lists the processor the adapter was trained with beside it
            listing = await client.get(f"/models/{model.id}/content", cast_to=object)
            assert "processor_config.json" in {f["name"] for f in listing["files"]}, listing["files"]

            async def answer() -> object:
                try:
                    return await client.chat.completions.create(model=job.fine_tuned_model, messages=question,
                                                                max_tokens=4, temperature=0)
                except openai.NotFoundError:      # serving has not heard of the promotion yet
                    return None
            reply = await until(answer, lambda r: r is not None, 120, "an answer from the fine-tuned model")
            print("VISION_E2E", json.dumps({"model": job.fine_tuned_model, "stage": model.model_extra["stage"],
                                            "answer": reply.choices[0].message.content,
                                            "prompt_tokens": reply.usage.prompt_tokens}))
            assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.prompt_tokens > 16
