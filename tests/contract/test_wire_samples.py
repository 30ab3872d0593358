"""Typed event fields stay byte-compatible: each recorded payload (samples/, written by the producers
before those fields had models) reads into its event model and writes back to the same JSON, key for
key and in the same order."""

import json
from pathlib import Path

import pytest

from whetstone.contracts import EVENT_MODELS, TOLERANT, CostEstimate, DatasetValidatedV1, JobQueuedV1

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
