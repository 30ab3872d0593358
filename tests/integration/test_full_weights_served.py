"""A full fine-tune (supervised, every weight trained, no LoRA) and continued pre-training (CPT), each from
upload to a served answer through the real platform, with the official `openai` client on the gateway:

- both train all weights of the tiny base; the gate loads each candidate as a model of its own: the full
  fine-tune scored on held-out chats (loss) and harmful prompts, CPT by held-out perplexity (every token)
  and a benchmark suite run by lm-eval on the candidate's own weights;
- the registry lists the weights (safetensors shards, config, tokenizer, model card) with a sha256 each
  and a presigned URL per file: the operator's shard size (300 kB) splits the ~875 kB tiny model into
  several shards and their index; the files downloaded that way load with transformers (the shards
  reassembled through the index) and answer exactly as the platform's serving does (greedy), which
  serves each model as a base of its own from the same shards;
- a CPT file sent for supervised training is refused at once with a 400 naming the file and its rows."""

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest

from whetstone.cli.dev import all_service_builders, upstreams_of
from whetstone.devstack.testing import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # two jobs through the whole platform
TERMINAL = ("succeeded", "failed", "cancelled")
HELLO = [{"role": "user", "content": "What is 3 + 5?"}]
SHARD_BYTES = 300_000   # the tiny model's weights are ~875 kB: three shards or more
SUITE = Path(__file__).resolve().parents[2] / "services/eval/src/whetstone/eval/suites/benchmarks"


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def chats(n: int, start: int = 0) -> bytes:
    return jsonl([{"messages": [{"role": "user", "content": f"What is {i} + {i + 2}?"},
                                {"role": "assistant", "content": f"{i} + {i + 2} = {2 * i + 2}."}]}
                  for i in range(start, start + n)])


def texts(n: int, start: int = 0) -> bytes:
    return jsonl([{"text": f"The river {i} runs north to the lake of stone {i % 4}, and the lake runs east."}
                  for i in range(start, start + n)])


def small_benchmark(dest: Path) -> Path:
    """One shipped lm-eval suite cut to 4 questions: the benchmarks stage runs for real, in seconds."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(SUITE / "wh_capitals.yaml", dest / "wh_capitals.yaml")
    lines = (SUITE / "wh_capitals.jsonl").read_text().splitlines()[:4]
    (dest / "wh_capitals.jsonl").write_text("\n".join(lines) + "\n")
    return dest


async def test_full_fine_tune_and_cpt_from_upload_to_a_served_answer(platform, settings, monkeypatch, tmp_path,
                                                                     openai_clients):
    from whetstone.modelkit.tiny import build_tiny_model

    monkeypatch.setenv("WHETSTONE_INGEST_MIN_EXAMPLES", "3")
    monkeypatch.setenv("WHETSTONE_TRAINER_AGENT_GPU_COUNT", "2")   # two slots: both jobs train at once
    monkeypatch.setenv("WHETSTONE_TRAINER_AGENT_FULL_WEIGHTS_MAX_SHARD_BYTES", str(SHARD_BYTES))
    monkeypatch.setenv("WHETSTONE_EVAL_TASK_DIR", str(small_benchmark(tmp_path / "bench")))
    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(*all_service_builders()) as p:
        async with openai_clients(upstreams_of(p.runtimes.values())) as (client, _other):
            await run(client, tmp_path)


async def processed(client: openai.AsyncOpenAI, data: bytes, name: str):
    f = await client.files.create(file=(name, data), purpose="fine-tune")
    f = await until(lambda: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 120, f"validation of {name}")
    assert f.status == "processed", f
    return f


async def trained(client: openai.AsyncOpenAI, job_id: str):
    job = await until(lambda: client.fine_tuning.jobs.retrieve(job_id), lambda j: j.status in TERMINAL, 600,
                      f"job {job_id}")
    assert job.status == "succeeded", job
    return await until(lambda: client.fine_tuning.jobs.retrieve(job_id), lambda j: j.fine_tuned_model, 60,
                       "fine_tuned_model")


async def answered(client: openai.AsyncOpenAI, model: str):
    try:
        return await client.chat.completions.create(model=model, messages=HELLO, max_tokens=6, temperature=0)
    except openai.NotFoundError:   # the serving projection follows the registry's events
        return None


async def run(client: openai.AsyncOpenAI, tmp: Path) -> None:
    sft, sft_valid, cpt, cpt_valid = await asyncio.gather(
        processed(client, chats(40), "sft.jsonl"), processed(client, chats(8, 100), "sft_valid.jsonl"),
        processed(client, texts(40), "cpt.jsonl"), processed(client, texts(8, 100), "cpt_valid.jsonl"))

    # a CPT file sent for supervised training: refused at once, naming the file and what its rows hold
    with pytest.raises(openai.BadRequestError) as refused:
        await client.fine_tuning.jobs.create(model="tiny-llama", training_file=cpt.id,
                                             method={"type": "supervised", "whetstone": {"method": "full"}})
    body = refused.value.body
    assert (body["code"], body["param"]) == ("method_dataset_mismatch", "training_file"), body
    assert cpt.id in body["message"] and "line 1" in body["message"] and "{\"text\"" in body["message"], body

    hp = {"n_epochs": 3, "batch_size": 8, "learning_rate_multiplier": 50, "max_seq_len": 64,
          "checkpoint_every_steps": 100}
    full = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=sft.id, validation_file=sft_valid.id, suffix="full",
        method={"type": "supervised", "supervised": {"hyperparameters": hp}, "whetstone": {"method": "full"}},
        extra_body={"eval_config": {"stages": {"benchmarks": False, "holdout": True, "safety": True, "judge": False}}})
    cont = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=cpt.id, validation_file=cpt_valid.id, suffix="cpt",
        method={"type": "supervised", "supervised": {"hyperparameters": hp}, "whetstone": {"method": "cpt"}},
        # a 4-question suite moves by 25 points per answer: the drop allowed is wide, the scores are checked
        extra_body={"eval_config": {"stages": {"benchmarks": {"max_drop_points": 100}, "holdout": True,
                                               "judge": False}}})
    full, cont = await asyncio.gather(trained(client, full.id), trained(client, cont.id))

    # the gate evaluated the weights themselves
    stages = {s["name"]: s for s in full.model_extra["eval"]["stages"]}
    assert {"holdout", "safety"} <= set(stages), full.model_extra["eval"]
    assert stages["holdout"]["status"] == "passed", stages["holdout"]
    assert stages["safety"]["status"] == "passed", stages["safety"]
    stages = {s["name"]: s for s in cont.model_extra["eval"]["stages"]}
    assert {"holdout", "benchmarks"} <= set(stages), cont.model_extra["eval"]
    assert stages["holdout"]["status"] == "passed" and "perplexity" in stages["holdout"]["reason"], stages["holdout"]
    assert stages["benchmarks"]["status"] in ("passed", "skipped"), stages["benchmarks"]
    [bench] = stages["benchmarks"]["metrics"]   # lm-eval ran on the candidate's own weights
    assert bench["name"] == "bench.wh_capitals.acc" and bench["candidate"] is not None, bench

    for job, method in ((full, "full"), (cont, "cpt")):
        ftm = job.fine_tuned_model
        model = await client.models.retrieve(ftm)
        assert model.model_extra["stage"] in ("staging", "production"), model.model_extra
        # the weights, each file by its own presigned URL, checked against the listed sha256
        listing = (await client.get(f"/models/{ftm}/content", cast_to=httpx.Response)).json()
        assert listing["format"] == "safetensors-full-weights" and listing["shards"], listing
        names = [f["name"] for f in listing["files"]]
        assert {"config.json", "README.md", "model.safetensors.index.json", *listing["shards"]} <= set(names), names
        shards = [f for f in listing["files"] if f["name"] in listing["shards"]]
        assert len(shards) >= 2 and "model.safetensors" not in names, listing["shards"]
        assert all(f["url"] and len(f["sha256"]) == 64 and f["size"] <= SHARD_BYTES for f in shards), shards
        assert len({f["url"] for f in shards}) == len(shards), "one presigned URL per shard"
        assert not any(n.endswith((".bin", ".pt", ".pkl")) or n.startswith("optimizer") for n in names), names
        local = tmp / method
        local.mkdir()
        async with httpx.AsyncClient(timeout=60) as anon:   # presigned: no identity needed
            for f in listing["files"]:
                data = (await anon.get(f["url"])).content
                assert hashlib.sha256(data).hexdigest() == f["sha256"] == listing["manifest"][f["name"]]
                (local / f["name"]).write_bytes(data)
        index = json.loads((local / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == set(listing["shards"]), index   # every shard, all in use
        card = (local / "README.md").read_text()
        assert "library_name: transformers" in card and f"method: {method}" in card, card[:600]

        # served: a base of its own, answering exactly as the downloaded weights do
        answer = await until(lambda ftm=ftm: answered(client, ftm), lambda a: a is not None, 120, f"{ftm} served")
        assert answer.model == ftm
        expected = await asyncio.to_thread(greedy, local, 6)
        assert (answer.choices[0].message.content or "").strip() == expected, (answer.choices[0].message.content,
                                                                              expected)


def greedy(model_dir: Path, max_new_tokens: int) -> str:
    """The downloaded model's own greedy answer to HELLO (transformers, nothing of the platform's serving)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = tok.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")   # the rendered chat, as a server tokenises it
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
