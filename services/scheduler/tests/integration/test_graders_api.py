"""The official `openai` client runs and validates graders through the gateway
(`client.fine_tuning.alpha.graders.run/validate`): OpenAI's response types parse, hostile python
graders come back as flags within their limits, and requests that cannot be graded answer 400
naming the field."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration

EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_json.city}}",
         "reference": "{{item.city}}", "operation": "eq"}
SIMILAR = {"type": "text_similarity", "name": "similar", "input": "{{sample.output_json.why}}",
           "reference": "{{item.why}}", "evaluation_metric": "rouge_l"}
MULTI = {"type": "multi", "name": "both", "graders": {"exact": EXACT, "similar": SIMILAR},
         "calculate_output": "0.75 * exact + 0.25 * similar"}
ITEM = {"city": "Paris", "why": "it is the capital of France"}
SAMPLE = '{"city": "Paris", "why": "the capital of France"}'


def python(source: str) -> dict:
    return {"type": "python", "name": "py", "source": source}


async def refused(call, param: str, code: str | None = None) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param, error
    if code:
        assert error["code"] == code, error
    return error["message"]


async def test_graders_run_and_validate_through_the_gateway(platform, monkeypatch):
    from whetstone.cli.keys import create_key
    from whetstone.scheduler.bootstrap import build_service as scheduler

    monkeypatch.setenv("WHETSTONE_GRADERS_PYTHON_TIMEOUT_S", "2")
    monkeypatch.setenv("WHETSTONE_GRADERS_PYTHON_CPU_S", "1")
    monkeypatch.setenv("WHETSTONE_GRADERS_JUDGES", '{"judge-small": {"base_url": "http://127.0.0.1:9/v1"}}')
    monkeypatch.setenv("WHETSTONE_PLATFORM_SECRET_FOR_TEST", "hunter2")
    async with platform(scheduler) as p:
        gw = await start_gateway(GatewaySettings(), {"scheduler": p.url("scheduler")}, port=0)
        try:
            key = (await asyncio.to_thread(create_key, "demo", name="rft", base_url=p.url("scheduler")))["key"]
            client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
            graders = client.fine_tuning.alpha.graders

            # -- run: OpenAI's GraderRunResponse, parsed by the client ---------------------------------
            result = await graders.run(grader=MULTI, model_sample=SAMPLE, item=ITEM)
            assert result.sub_rewards == {"exact": 1.0, "similar": pytest.approx(0.8)}  # LCS 4: P 4/4, R 4/6
            assert result.reward == pytest.approx(0.75 + 0.25 * result.sub_rewards["similar"])
            assert result.metadata.name == "both" and result.metadata.type == "multi"
            assert result.metadata.errors.formula_parse_error is False and result.metadata.execution_time >= 0
            assert result.metadata.scores == result.sub_rewards
            miss = await graders.run(grader=EXACT, model_sample='{"city": "Rome"}', item=ITEM)
            assert miss.reward == 0.0 and miss.metadata.scores == {"exact": 0.0}
            not_json = await graders.run(grader=EXACT, model_sample="Paris", item=ITEM)
            assert not_json.reward == 0.0 and not_json.metadata.errors.sample_parse_error is True

            ok = await graders.run(grader=python("def grade(sample, item):\n"
                                                 "    return float(sample['output_json']['city'] == item['city'])"),
                                   model_sample=SAMPLE, item=ITEM)
            assert ok.reward == 1.0 and ok.metadata.type == "python"
            # hostile python graders: flags in a 200, within the limits, no secret in the reply
            began = time.monotonic()
            loop = await graders.run(grader=python("def grade(s, i):\n    while True:\n        pass"),
                                     model_sample="x", item={})
            assert loop.reward == 0.0 and loop.metadata.errors.python_grader_server_error is True
            assert time.monotonic() - began < 6
            for source, detail in [
                ("def grade(s, i):\n    raise KeyError('gold')", "KeyError: 'gold'"),
                ("def grade(s, i):\n    b = bytearray(10 * 1024 ** 3)\n    return 1.0", "MemoryError"),
                ("import socket\ndef grade(s, i):\n    socket.create_connection(('8.8.8.8', 53), timeout=1)",
                 "OSError"),
                ("import os\ndef grade(s, i):\n    while True:\n        os.fork()", "Resource temporarily unavailable"),
                ("def grade(s, i):\n    raise RuntimeError(open('/proc/self/environ').read())", "PATH="),
            ]:
                flagged = await graders.run(grader=python(source), model_sample="x", item={})
                errors = flagged.metadata.errors
                assert errors.python_grader_runtime_error is True, (source, errors)
                assert detail in errors.python_grader_runtime_error_details, (source, errors)
                assert "hunter2" not in flagged.model_dump_json() and "WHETSTONE" not in flagged.model_dump_json()

            # -- validate -----------------------------------------------------------------------------
            valid = await graders.validate(grader=MULTI)
            assert valid.grader.type == "multi" and valid.grader.calculate_output == MULTI["calculate_output"]

            # -- refused before running, the field named ----------------------------------------------
            await refused(graders.validate(grader={**MULTI, "calculate_output": "exact + __import__(similar)"}),
                          "grader.calculate_output", "invalid_formula")
            await refused(graders.validate(grader={**MULTI, "calculate_output": "exact + secret"}),
                          "grader.calculate_output", "invalid_formula")
            message = await refused(graders.run(grader=MULTI, model_sample=SAMPLE, item={"city": "Paris"}),
                                    "grader.graders.similar.reference", "missing_item_field")
            assert "{{item.why}}" in message and "city" in message
            message = await refused(graders.validate(grader={
                "type": "score_model", "name": "j", "model": "gpt-4o",
                "input": [{"role": "user", "content": "{{sample.output_text}}"}]}), "grader.model",
                "model_not_configured")
            assert "judge-small" in message
            await refused(graders.validate(grader={**EXACT, "input": "{{env.PATH}}"}), "grader.input")
            await refused(graders.validate(grader={**EXACT, "regex": True}), "grader.regex")
            await refused(graders.validate(grader={**SIMILAR, "evaluation_metric": "cosine"}),
                          "grader.evaluation_metric", "metric_not_available")
            await refused(graders.validate(grader=python("def grade(sample, item)\n    return 1")), "grader.source",
                          "invalid_python_source")
            await refused(graders.run(grader={"type": "label_model", "name": "l", "model": "judge-small",
                                              "input": [], "labels": ["a"], "passing_labels": ["a"]},
                                      model_sample="x", item={}), "grader.type")
        finally:
            await gw.stop()
