"""The wire contract: strict producers, tolerant consumers, schemas that cannot silently break."""

import copy
import json

import pytest
from pydantic import ValidationError

from whetstone.contracts import EVENT_MODELS, TOLERANT, TOPICS, Envelope, job_id_for
from whetstone.contracts import Hyperparameters, JobRequestedV1, NodeHeartbeatV1
from whetstone.contracts.schemas import SCHEMA_DIR, check, current_schemas, incompatibilities

pytestmark = pytest.mark.unit

REQUIRED_TOPICS = ["dataset.submitted", "dataset.validated", "job.requested", "job.queued", "job.assigned",
                   "job.started", "job.progress", "checkpoint.written", "job.preempted", "job.completed",
                   "job.failed", "eval.completed", "model.registered", "model.promoted", "usage.metered",
                   "node.heartbeat"]


def test_topic_table_covers_every_design_topic():
    assert set(REQUIRED_TOPICS) <= set(TOPICS)
    for t in TOPICS.values():
        assert t.key_field in t.model.model_fields, f"{t.name}: key {t.key_field} is not a payload field"
        assert t.partitions >= 1
        assert t.model.__name__.endswith(f"V{t.model.SCHEMA_VERSION}")
        assert EVENT_MODELS[t.model.EVENT_TYPE] is t.model


def test_producers_are_strict():
    with pytest.raises(ValidationError, match="unknown field"):
        Hyperparameters(n_epoch=3)
    with pytest.raises(ValidationError, match="unknown field"):
        JobRequestedV1(job_id="x", idempotency_key="k", model="m", training_file="ds", colour="red")


def test_consumers_are_tolerant_of_new_fields():
    payload = {"job_id": "j", "idempotency_key": "k", "model": "m", "training_file": "ds",
               "hyperparameters": {"n_epochs": 2, "added_in_v1_1": True}, "added_later": 1}
    ev = JobRequestedV1.model_validate(payload, context=TOLERANT)
    assert ev.hyperparameters.n_epochs == 2
    env = Envelope.model_validate({"event_type": "job.requested", "producer": "p", "tenant_id": "t", "key": "k",
                                   "payload": payload, "future_header": "x"}, context=TOLERANT)
    assert env.payload["added_later"] == 1


def test_out_of_range_hyperparameters_are_rejected_with_the_field_name():
    with pytest.raises(ValidationError) as err:
        Hyperparameters(learning_rate=-1)
    assert "learning_rate" in str(err.value)


def test_job_id_is_derived_from_tenant_and_key():
    assert job_id_for("a", "k") == job_id_for("a", "k")
    assert job_id_for("a", "k") != job_id_for("b", "k")


def test_committed_schemas_match_the_models():
    """`make contracts` was run after the last model change, and nothing broke compatibility."""
    assert check() == []
    committed = {p.name for p in SCHEMA_DIR.glob("*.json")}
    assert set(current_schemas()) == committed


def _heartbeat_schema():
    return copy.deepcopy(NodeHeartbeatV1.model_json_schema())


@pytest.mark.parametrize("mutate, expected", [
    (lambda s: s["properties"].pop("spot"), "spot: field removed or renamed"),
    (lambda s: s["properties"].__setitem__("gpu_spares", s["properties"].pop("free_gpu_ids")),
     "free_gpu_ids: field removed or renamed"),
    (lambda s: s["properties"].__setitem__("gpu_count", {"type": "string"}), "gpu_count: type changed"),
    (lambda s: (s["properties"].__setitem__("zone", {"type": "string"}), s["required"].append("zone")),
     "zone: new required field"),
])
def test_backward_incompatible_changes_are_detected(mutate, expected):
    old = _heartbeat_schema()
    new = _heartbeat_schema()
    mutate(new)
    problems = incompatibilities(old, new)
    assert any(expected in p for p in problems), problems


def test_compatible_changes_pass():
    old = _heartbeat_schema()
    new = _heartbeat_schema()
    new["properties"]["zone"] = {"default": None, "anyOf": [{"type": "string"}, {"type": "null"}]}
    assert incompatibilities(old, new) == []


def test_enum_value_removal_is_detected():
    from whetstone.contracts.events import CheckpointWrittenV1
    old = CheckpointWrittenV1.model_json_schema()
    new = json.loads(json.dumps(old).replace('"emergency", ', ''))
    assert any("enum values removed" in p for p in incompatibilities(old, new))
