"""A reinforcement fine-tuning job end to end through the real platform with the official `openai`
client: RFT files uploaded with OpenAI's purpose "fine-tune" (messages ending with a user
turn, the item's fields beside them) are validated as rft data; the job (`method.type ==
"reinforcement"`, a text_similarity grader) trains with GRPO on the trainer agent; the eval gate
grades the held-out prompts (ingest's split of the training file, as no `validation_file` is given;
services/scheduler's test_rft_jobs checks that a given one replaces the split) with the job's own grader, candidate
vs base, and the registry records the verdict with the reward stage's numbers (a model whose reward
does not beat the base's is quarantined). A few GRPO steps need not move the greedy answers: the
test holds the platform to a consistent verdict, not to a gain (services/eval's tests plant both)."""

import asyncio
import json
from pathlib import Path

import pytest

from whetstone.cli.dev import all_service_builders, upstreams_of
from whetstone.devstack.testing import until

pytestmark = pytest.mark.integration
TERMINAL = ("succeeded", "failed", "cancelled")
GRADER = {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
          "reference": "{{item.target}}", "evaluation_metric": "fuzzy_match"}


def rft_rows(numbers: range) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"Tell me about the number {i}."}], "target": "the the the",
             "id": i} for i in numbers]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def test_reinforcement_job_from_upload_to_the_gates_reward_verdict(platform, settings, openai_clients):
    from whetstone.modelkit.tiny import build_tiny_model

    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(*all_service_builders()) as p:
        async with openai_clients(upstreams_of(p.runtimes.values())) as (client, _other):
            f = await client.files.create(file=("train.jsonl", rft_rows(range(24))), purpose="fine-tune")
            f = await until(lambda: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 120,
                            "validation of the rft file")
            assert f.status == "processed", f.model_extra
            job = await client.fine_tuning.jobs.create(
                model="tiny-llama", training_file=f.id,
                method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
                    "n_epochs": 1, "batch_size": 4, "compute_multiplier": 0.5, "learning_rate_multiplier": 10,
                    "reasoning_effort": "low", "max_completion_tokens": 16}}},   # the budget, in place of low's 128
                extra_body={"eval_config": {"stages": ["holdout"]}})
            assert job.method.type == "reinforcement"
            job = await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status in TERMINAL, 900,
                              f"job {job.id}")
            assert job.status == "succeeded", job
            models = await until(lambda: client.models.list(extra_query={"job_id": job.id}), lambda page: page.data,
                                 120, "the registered model")
            model = await client.models.retrieve(models.data[0].id)
            lineage = model.model_extra["lineage"]
            stages = {s["name"]: s for s in lineage["eval_stages"]}
            holdout = stages["holdout"]
            assert holdout["details"]["metric"] == "reward" and holdout["details"]["grader"] == "close (text_similarity)"
            reward = next(m for m in holdout["metrics"] if m["name"] == "holdout_reward")
            print("RFT_E2E", json.dumps({"verdict": lineage["eval_verdict"], "stage": model.model_extra["stage"],
                                         "reward_base": reward["base"], "reward_candidate": reward["candidate"],
                                         "reason": holdout["reason"]}))
            assert lineage["eval_verdict"] == holdout["status"]
            assert (model.model_extra["stage"] == "quarantined") == (holdout["status"] == "failed")
