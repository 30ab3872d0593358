"""`whet graders validate|run` and `whet jobs create --method reinforcement --grader FILE`, in process,
against the scheduler (which serves the graders API and takes jobs) behind the real gateway: grader
files are checked locally first (bad JSON or an unknown field: exit 2 naming the line or field, no
request), what only the deployment knows is the API's 400, and a reinforcement job carries the file's
grader in OpenAI's method object."""

import asyncio
import json
import os
from pathlib import Path

import pytest
from openai.types.fine_tuning.alpha import GraderRunResponse
from whetstone.cli.main import main
from whetstone.contracts import DatasetValidatedV1
from whetstone.devstack.grader_samples import EXACT_OR_CLOSE as GRADER
from whetstone.devstack.testing import send_event, wait_until
from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "vocab_size": 1536, "num_attention_heads": 4, "max_position_embeddings": 512}


def write(root: Path, name: str, value: object) -> str:
    path = root / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


async def test_graders_and_reinforcement_jobs_from_the_cli(platform, settings, monkeypatch, capsys, tmp_path):
    from whetstone.scheduler.bootstrap import build_service as scheduler

    model = Path(settings.model_catalog) / "tiny-llama"   # the scheduler sizes it; it never loads weights
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY))
    (model / "model.safetensors").write_bytes(b"weights")
    grader = write(tmp_path, "grader.json", GRADER)
    item = write(tmp_path, "item.json", {"answer": "Paris"})
    async with platform(scheduler) as p:
        gw = await start_gateway(GatewaySettings(), {"scheduler": p.url("scheduler")}, port=0)
        try:
            monkeypatch.setenv("WHETSTONE_SCHEDULER_URL", p.url("scheduler"))
            monkeypatch.setenv("WHETSTONE_BASE_URL", f"{gw.url}/v1")

            def whet(*argv: str) -> tuple[int, str, str]:
                code = main(list(argv))
                captured = capsys.readouterr()
                return code, captured.out.strip(), captured.err.strip()

            async def run(*argv: str) -> tuple[int, str, str]:
                return await asyncio.to_thread(whet, *argv)

            code, out, err = await run("keys", "create", "demo", "--name", "rft")
            assert code == 0, err
            monkeypatch.setenv("WHETSTONE_API_KEY", out.splitlines()[-1])

            # -- validate: the deployment's verdict, readable or as the API's JSON --------------------
            code, out, err = await run("graders", "validate", grader)
            assert code == 0, err
            assert out.splitlines()[0] == "valid: reward (multi)" and "reads item fields: answer" in out, out
            code, out, _ = await run("graders", "validate", grader, "--json")
            assert code == 0 and json.loads(out)["grader"]["graders"]["close"]["evaluation_metric"] == "fuzzy_match"
            # checked here first: no request is made for a file that is not a grader (exit 2, named)
            code, out, err = await run("graders", "validate", write(tmp_path, "broken.json", '{"type": "multi",\n'))
            assert code == 2 and "broken.json: line 2 column 1: not valid JSON" in err, err
            typo = {**GRADER["graders"]["exact"], "operator": "eq"}
            code, out, err = await run("graders", "validate", write(tmp_path, "typo.json", typo))
            assert code == 2 and "grader.operator: unknown field" in err, err
            code, out, err = await run("graders", "validate", write(tmp_path, "outside.json", {
                **GRADER["graders"]["exact"], "input": "{{secrets.key}}"}))
            assert code == 2 and "grader.input" in err, err
            # what only the deployment knows is the API's 400, the field named
            judge = {"type": "score_model", "name": "j", "model": "gpt-4o",
                     "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
            code, out, err = await run("graders", "validate", write(tmp_path, "judge.json", judge))
            assert code == 1 and "400" in err and "(param: grader.model)" in err, err

            # -- run: the reward, its sub-rewards; --json is OpenAI's GraderRunResponse -------------
            code, out, err = await run("graders", "run", grader, "--sample-text", "Paris", "--item", item)
            assert code == 0, err
            lines = out.splitlines()
            assert lines[0].startswith("reward 1.0000  (reward, multi,"), out
            assert [line.split() for line in lines[1:]] == [["exact", "1.0000"], ["close", "1.0000"]]
            sample = write(tmp_path, "sample.txt", "Pariss\n")   # one final newline is not part of the sample
            code, out, _ = await run("graders", "run", grader, "--sample", sample, "--item", item, "--json")
            result = GraderRunResponse.model_validate(json.loads(out))
            assert code == 0 and result.sub_rewards["exact"] == 0.0 and 0.0 < result.sub_rewards["close"] < 1.0
            assert result.reward == pytest.approx(0.2 * result.sub_rewards["close"])
            code, out, err = await run("graders", "run", grader, "--sample-text", "Paris",
                                       "--item", write(tmp_path, "other.json", {"city": "Paris"}))
            assert code == 1 and "missing_item_field" in err and "item.answer" in err and "city" in err, err
            raises = {"type": "python", "name": "py", "source": "def grade(sample, item):\n    raise ValueError('no')"}
            code, out, err = await run("graders", "run", write(tmp_path, "py.json", raises), "--sample-text", "x")
            assert code == 1 and out.startswith("reward 0.0000  (py, python,"), out
            assert "error python_grader_runtime_error: " in out and "ValueError" in out, out

            # -- jobs create --method reinforcement --grader FILE --------------------------------------
            await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
                dataset_id="file-rft", version="ab" * 32, name="rft.jsonl", status="accepted", purpose="rft",
                rows_total=20, rows_kept=20, tokens_total=2000,
                train_uri="s3://whetstone/tenants/demo/datasets/file-rft/train.jsonl"), "demo")
            await wait_until(lambda: p["scheduler"].pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
            code, out, err = await run("jobs", "create", "--training-file", "file-rft", "--method", "reinforcement",
                                       "--grader", grader, "--epochs", "2", "--batch-size", "4",
                                       "--compute-multiplier", "1.5", "--eval-interval", "3",
                                       "--reasoning-effort", "low", "--seed", "7", "--qlora")
            assert code == 0 and out.splitlines()[-1].startswith("ftjob-"), err
            assert '"reasoning_effort": "low"' in out and "\n  grader reward (multi)\n" in out, out
            code, out, _ = await run("jobs", "get", out.splitlines()[-1], "--json")
            job = json.loads(out)
            assert job["method"]["type"] == "reinforcement" and job["seed"] == 7
            assert job["method"]["whetstone"] == {"method": "qlora"}
            assert job["method"]["reinforcement"]["grader"]["graders"]["exact"]["reference"] == "{{item.answer}}"
            hp = job["method"]["reinforcement"]["hyperparameters"]
            assert (hp["n_epochs"], hp["batch_size"], hp["compute_multiplier"], hp["eval_interval"],
                    hp["reasoning_effort"]) == (2, 4, 1.5, 3, "low"), hp
            # refused before any request: a grader without the method, the method without a grader
            code, _, err = await run("jobs", "create", "--training-file", "file-rft", "--grader", grader)
            assert code == 2 and "--grader is for --method reinforcement" in err, err
            code, _, err = await run("jobs", "create", "--training-file", "file-rft", "--qlora")
            assert code == 2 and "--qlora is for --method reinforcement" in err, err
            code, _, err = await run("jobs", "create", "--training-file", "file-rft", "--method", "reinforcement")
            assert code == 2 and "needs --grader FILE" in err, err
            # the API's own refusal of a knob, the field named
            code, _, err = await run("jobs", "create", "--training-file", "file-rft", "--method", "reinforcement",
                                     "--grader", grader, "--epochs", "-1")
            assert code == 1 and "method.reinforcement.hyperparameters.n_epochs" in err, err
        finally:
            await gw.stop()
            os.environ.pop("WHETSTONE_API_KEY", None)
