"""score_model / label_model against an OpenAI-compatible chat endpoint over real HTTP. The endpoint
here is a small aiohttp server standing in for the operator's judge model (a third-party service):
it answers what the test scripts and records what it was sent."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from whetstone.graders import Endpoint, GraderEnvironment, GraderSettings, parse_grader, run_grader

pytestmark = pytest.mark.integration


async def with_judge(answers: list, check):
    """Run `check(env, seen)` against a judge that replies with `answers` in order."""
    seen: list[dict] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("Authorization")})
        answer = answers[min(len(seen) - 1, len(answers) - 1)]
        if isinstance(answer, int):
            return web.Response(status=answer, text="overloaded")
        message = {"role": "assistant", "content": answer.get("content"), "refusal": answer.get("refusal")}
        return web.json_response({"choices": [{"index": 0, "message": message}],
                                  "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        vectors = {"north": [1.0, 0.0], "up": [0.8, 0.6], "south": [-1.0, 0.0]}
        return web.json_response({"data": [{"index": i, "embedding": vectors[t]} for i, t in enumerate(body["input"])]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    env = GraderEnvironment(GraderSettings(
        judges={"judge-1": Endpoint(base_url=base, model="upstream-judge", api_key_env="WHETSTONE_TEST_JUDGE_KEY")},
        embeddings=Endpoint(base_url=base, model="embed-1")))
    try:
        await check(env, seen)
    finally:
        await env.close()
        await runner.cleanup()


SCORE = {"type": "score_model", "name": "judge", "model": "judge-1", "range": [0, 10],
         "input": [{"role": "developer", "content": "Grade the answer to {{item.question}}."},
                   {"role": "user", "content": [{"type": "input_text", "text": "Answer: {{sample.output_text}}"}]}]}


def test_score_model_sends_rendered_messages_and_reads_the_score(monkeypatch):
    monkeypatch.setenv("WHETSTONE_TEST_JUDGE_KEY", "sk-judge")

    async def check(env, seen):
        sampled = {**SCORE, "sampling_params": {"max_completions_tokens": 32, "reasoning_effort": "low", "seed": 3,
                                                "temperature": 0.0}}
        result = await run_grader(parse_grader(sampled), "Paris", {"question": "capital of France?"}, env)
        assert result.reward == 7.5 and not result.metadata.errors.any()
        assert result.metadata.token_usage == 13
        assert result.model_dump()["model_grader_token_usage_per_model"] == {
            "judge-1": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}
        sent = seen[0]["body"]
        assert sent["model"] == "upstream-judge" and seen[0]["auth"] == "Bearer sk-judge"
        assert sent["messages"][0] == {"role": "system", "content": "Grade the answer to capital of France?."}
        assert sent["messages"][1]["content"] == [{"type": "text", "text": "Answer: Paris"}]
        assert sent["response_format"]["json_schema"]["schema"]["properties"]["result"]["maximum"] == 10
        # the grader's sampling parameters, the token budget as max_tokens, reasoning_effort left out
        assert {k: sent[k] for k in list(sent)[3:]} == {"max_tokens": 32, "seed": 3, "temperature": 0.0}

    asyncio.run(with_judge([{"content": json.dumps({"result": 7.5})}], check))


@pytest.mark.parametrize("answer, flag", [
    ({"content": "no idea"}, "model_grader_parse_error"),
    ({"content": json.dumps({"result": 42})}, "model_grader_parse_error"),     # outside range [0, 10]
    ({"content": None, "refusal": "I can't help with that"}, "model_grader_refusal_error"),
    (503, "model_grader_server_error"),
])
def test_judge_failures_are_flags(answer, flag):
    async def check(env, seen):
        result = await run_grader(parse_grader(SCORE), "Paris", {"question": "q"}, env)
        assert result.reward == 0.0 and getattr(result.metadata.errors, flag)
        if flag == "model_grader_server_error":
            assert result.metadata.errors.model_grader_server_error_details == "the endpoint answered HTTP 503"

    asyncio.run(with_judge([answer], check))


def test_label_model_inside_multi_and_cosine():
    grader = parse_grader({"type": "multi", "name": "m", "calculate_output": "label + direction", "graders": {
        "label": {"type": "label_model", "name": "label", "model": "judge-1", "labels": ["good", "bad"],
                  "passing_labels": ["good"], "input": [{"role": "user", "content": "{{sample.output_text}}"}]},
        "direction": {"type": "text_similarity", "name": "direction", "input": "{{sample.output_text}}",
                      "reference": "{{item.ref}}", "evaluation_metric": "cosine"}}})

    async def check(env, seen):
        result = await run_grader(grader, "up", {"ref": "north"}, env)
        assert result.sub_rewards == {"label": 1.0, "direction": pytest.approx(0.8)}
        assert result.reward == pytest.approx(1.8)
        assert seen[0]["body"]["response_format"]["json_schema"]["schema"]["properties"]["result"]["enum"] == \
            ["good", "bad"]

    asyncio.run(with_judge([{"content": json.dumps({"result": "good"})}], check))
