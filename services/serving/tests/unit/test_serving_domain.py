import pytest

from whetstone.serving.domain.catalog import (
    BaseModelMismatch, CapacityExhausted, ContextLengthExceeded, ModelNotDeployed, ModelNotFound, ModelVersion,
    check_servable_on, choose_version, completion_budget,
)
from whetstone.serving.domain.openai import ChatCompletionRequest, chat_chunk, chat_completion
from whetstone.serving.domain.residency import LruBudget
from whetstone.serving.domain.routing import InvalidRoute, bucket, make_route, pick_variant

pytestmark = pytest.mark.unit


def version(model_id, stage, seq, name="ft:m:demo:s", base="a" * 64):
    return ModelVersion(model_id=model_id, tenant_id="demo", name=name, stage=stage, artifact_uri="s3://b/k",
                        artifact_sha256="c" * 64, base_model="tiny", base_model_sha256=base, sequence=seq)


def test_a_name_resolves_to_production_first_then_the_newest_staging():
    vs = [version("v1", "production", 1), version("v2", "staging", 5), version("v3", "staging", 3)]
    assert choose_version("ft:m:demo:s", vs).model_id == "v1"
    assert choose_version("ft:m:demo:s", vs[1:]).model_id == "v2"
    assert choose_version("v3", vs).model_id == "v3"  # a model id pins one version


def test_unknown_and_undeployed_models_are_refused_with_their_codes():
    with pytest.raises(ModelNotFound):
        choose_version("nope", [])
    with pytest.raises(ModelNotDeployed, match="archived"):
        choose_version("ft:m:demo:s", [version("v1", "dev", 1), version("v1b", "archived", 2)])


def test_an_adapter_trained_on_another_base_sha_is_never_served():
    check_servable_on(version("v1", "staging", 1), "a" * 64)
    with pytest.raises(BaseModelMismatch):
        check_servable_on(version("v1", "staging", 1, base="b" * 64), "a" * 64)
    with pytest.raises(BaseModelMismatch):
        check_servable_on(version("v1", "staging", 1, base=None), "a" * 64)


def test_completion_budget_follows_the_context():
    assert completion_budget(10, None, 64, 1024, "messages") == 64
    assert completion_budget(1000, None, 64, 1024, "messages") == 24
    assert completion_budget(10, 100, 64, 1024, "prompt") == 100
    with pytest.raises(ContextLengthExceeded, match="1024 tokens") as err:
        completion_budget(1020, 10, 64, 1024, "messages")
    assert err.value.param == "messages"
    with pytest.raises(ContextLengthExceeded):
        completion_budget(1024, None, 64, 1024, "messages")


def test_routes_split_by_weight_and_stay_sticky_per_user():
    route = make_route("ft:m:demo:s", [("v1", 90), ("v2", 10)])
    picks = [pick_variant(route, f"user-{i}", 0.0).model_id for i in range(2000)]
    share = picks.count("v1") / len(picks)
    assert 0.86 < share < 0.94
    assert all(pick_variant(route, f"user-{i}", 0.99).model_id == picks[i] for i in range(50))  # sticky
    assert pick_variant(route, None, 0.95).model_id == "v2" and pick_variant(route, None, 0.5).model_id == "v1"
    assert 0 <= bucket("r", "u") < 1


@pytest.mark.parametrize("variants", [[], [("v1", 0)], [("v1", 1), ("v1", 2)], [("v1", -1), ("v2", 1)],
                                      [(f"v{i}", 1) for i in range(5)]])
def test_invalid_routes_are_refused(variants):
    with pytest.raises(InvalidRoute):
        make_route("r", variants)


def test_lru_budget_evicts_least_recently_used_but_never_a_pinned_adapter():
    lru = LruBudget(2)
    lru.add("a")
    lru.add("b")
    lru.touch("a")
    assert lru.victims_for(1) == ["b"]
    lru.pin("b")
    assert lru.victims_for(1) == ["a"]
    lru.pin("a")
    with pytest.raises(CapacityExhausted):
        lru.victims_for(1)
    lru.unpin("a")
    lru.remove(lru.victims_for(1))
    assert lru.keys() == ["b"]


def test_openai_shapes():
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "developer", "content": [
        {"type": "text", "text": "be brief"}]}], "stop": "x", "unknown_param": 1})
    assert req.messages[0].as_template_message() == {"role": "system", "content": "be brief"} and req.stops() == ["x"]
    body = chat_completion("id", "m", [("hi", "stop")], 3, 1, created=1)
    assert body["object"] == "chat.completion" and body["usage"]["total_tokens"] == 4
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi", "refusal": None}
    assert chat_chunk("id", "m", 1, None, usage_={"total_tokens": 1})["choices"] == []
