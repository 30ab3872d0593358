"""Typed event fields stay byte-compatible: each recorded payload (samples/, written by the producers
before those fields had models) reads into its event model and writes back to the same JSON, key for
key and in the same order."""

import json
from pathlib import Path

import pytest

from pydantic import ValidationError
from whetstone.contracts import (EVENT_MODELS, TOLERANT, CostEstimate, DatasetValidatedV1, JobAssignedV1, JobQueuedV1,
                                 Rendezvous)

pytestmark = pytest.mark.unit

SAMPLES = sorted((Path(__file__).parent / "samples").glob("*.json"))


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_recorded_payload_round_trips_byte_for_byte(sample: Path):
    recorded = json.loads(sample.read_text())
    model = EVENT_MODELS[recorded["event_type"]]
    consumed = model.model_validate(recorded["payload"], context=TOLERANT)
    assert compact(consumed.model_dump(mode="json")) == compact(recorded["payload"])
    produced = model(**recorded["payload"])   # a producer building the event from the same fields
    assert compact(produced.model_dump(mode="json")) == compact(recorded["payload"])


def test_cost_estimate_fields_are_typed_after_reading():
    accepted = json.loads((Path(__file__).parent / "samples" / "dataset.validated.accepted.json").read_text())
    ev = DatasetValidatedV1.model_validate(accepted["payload"], context=TOLERANT)
    assert ev.cost_estimate is not None and ev.cost_estimate.cheapest is not None
    assert ev.cost_estimate.estimates and ev.cost_estimate.cheapest == ev.cost_estimate.estimates[0]
    assert ev.cost_estimate.cheapest.gpu_hours > 0 and ev.cost_estimate.params_source == "safetensors"


def test_the_scheduler_extends_ingest_estimate_to_the_recorded_job_queued():
    """`CostEstimate.for_job` (what admission sends) writes what the dict merge it replaced wrote."""
    samples = Path(__file__).parent / "samples"
    dataset = json.loads((samples / "dataset.validated.accepted.json").read_text())["payload"]["cost_estimate"]
    queued = json.loads((samples / "job.queued.training.json").read_text())["payload"]["cost_estimate"]
    extended = CostEstimate.model_validate(dataset, context=TOLERANT).for_job(812.4372, 0.225714, over_soft_quota=True)
    assert compact(extended.model_dump(mode="json")) == compact(queued)
    merge = json.loads((samples / "job.queued.merge.json").read_text())["payload"]["cost_estimate"]
    assert compact(CostEstimate(merge_id="merge-9").for_job(60.0, 0.016666, False).model_dump(mode="json")) \
        == compact(merge)
    assert "over_soft_quota" not in CostEstimate().for_job(1.0, 1.0, False).model_dump(mode="json")


def test_a_price_version_pin_is_read_typed():
    ev = JobQueuedV1.model_validate(
        json.loads((Path(__file__).parent / "samples" / "job.queued.merge.json").read_text())["payload"]
        | {"cost_estimate": {"price_version": "2026-11", "estimated_gpu_hours": 1.0}}, context=TOLERANT)
    assert ev.cost_estimate is not None and ev.cost_estimate.price_version == "2026-11"


def test_a_gang_member_reads_its_rendezvous_typed():
    gang = json.loads((Path(__file__).parent / "samples" / "job.assigned.gang.json").read_text())["payload"]
    meet = JobAssignedV1.model_validate(gang, context=TOLERANT).rendezvous
    assert meet == Rendezvous(master_addr="10.1.0.1", node_rank=1, nodes=2, hosts=["10.1.0.1", "gpu-b2"])
    assert meet.master_port is None and "master_port" not in meet.model_dump(mode="json")
    named = json.loads((Path(__file__).parent / "samples" / "job.assigned.port.json").read_text())["payload"]
    meet = JobAssignedV1.model_validate(named, context=TOLERANT).rendezvous
    assert meet is not None and meet.master_port == 29611 and meet.hosts == []
    assert "hosts" not in meet.model_dump(mode="json")


@pytest.mark.parametrize(("rendezvous", "field"), [
    ({"master_addr": "a", "node_rank": "first", "nodes": 2}, "node_rank"),
    ({"master_addr": "a", "node_rank": 0, "nodes": "two"}, "nodes"),
    ({"master_addr": ["a"], "node_rank": 0, "nodes": 2}, "master_addr"),
    ({"master_addr": "", "node_rank": 0, "nodes": 2}, "master_addr"),
    ({"node_rank": 0, "nodes": 2}, "master_addr"),
    ({"master_addr": "a", "node_rank": 0, "nodes": 2, "master_port": 70000}, "master_port"),
    ({"master_addr": "a", "node_rank": 0, "nodes": 2, "hosts": "a,b"}, "hosts"),
    ({"master_addr": "a", "node_rank": 2, "nodes": 2}, "node_rank 2 is not below nodes 2"),
    ({"master_addr": "a", "node_rank": -1, "nodes": 2}, "node_rank"),
    ({"master_addr": "a", "node_rank": 0, "nodes": 2, "hosts": ["a"]}, "hosts lists 1 addresses for nodes 2"),
])
def test_a_malformed_rendezvous_is_refused_naming_the_field(rendezvous: dict[str, object], field: str):
    gang = json.loads((Path(__file__).parent / "samples" / "job.assigned.gang.json").read_text())["payload"]
    with pytest.raises(ValidationError, match=field) as refused:
        JobAssignedV1.model_validate({**gang, "rendezvous": rendezvous}, context=TOLERANT)
    assert refused.value.errors()[0]["loc"][0] == "rendezvous"


def test_ingest_gate_figures_are_typed_after_reading_and_unknown_ones_are_kept():
    sample = json.loads((Path(__file__).parent / "samples" / "dataset.validated.gate_stats.json").read_text())["payload"]
    stats = DatasetValidatedV1.model_validate(sample, context=TOLERANT).stats
    assert stats.rows_with_images == 0 and stats.tokenization and stats.tokenization.tokenized_cache == "written"
    assert stats.token_histogram and stats.token_histogram[-1].max is None
    assert stats.contamination_examples and stats.contamination_examples[1].reference is None
    newer = {**sample, "stats": {**sample["stats"], "a_newer_figure": {"kept": [1, 2]}}}
    read = DatasetValidatedV1.model_validate(newer, context=TOLERANT)
    assert compact(read.model_dump(mode="json")) == compact(newer)   # a newer ingest's key comes back as sent
    with pytest.raises(ValidationError, match="a_newer_figure"):  # a producer of this version may not send one
        DatasetValidatedV1(**newer)
    with pytest.raises(ValidationError, match="stats.token_histogram.0.count"):
        DatasetValidatedV1.model_validate({**sample, "stats": {"token_histogram": [{"min": 0, "count": "many"}]}},
                                          context=TOLERANT)
