"""`whet jobs trace`: the join of the events read from Kafka with the services' deliveries, and
where the service URLs come from."""

import json

import pytest

from whetstone.cli.trace import Delivery, TopicRecord, build_trace, render, service_urls

pytestmark = pytest.mark.unit


def rec(topic: str, offset: int, event_id: str, event_type: str, producer: str, at: str,
        job: str = "ftjob-1") -> TopicRecord:
    return TopicRecord.model_validate({"topic": topic, "partition": 0, "offset": offset, "appended_at": at.replace(".0", ".5"),
            "envelope": {"event_id": event_id, "event_type": event_type, "producer": producer, "occurred_at": at,
                         "trace_id": "t1", "tenant_id": "demo", "key": job, "payload": {"job_id": job}}})


def delivery(service: str, event_id: str, consumed: str, lag: float, handler: float, **kw) -> Delivery:
    return Delivery.model_validate({"service": service, "consumer": f"whetstone-{service}", "event_id": event_id, "consumed_at": consumed,
            "handled_at": consumed, "lag_s": lag, "handler_s": handler, "outcome": "handled",
            "event_type": kw.get("event_type", "x"), "topic": kw.get("topic", "x"), "producer": kw.get("producer"),
            "produced_at": kw.get("produced_at"), "trace_id": "t1", "tenant_id": "demo"})


def test_events_in_production_order_with_their_consumers_in_consumption_order():
    events = [rec("job.completed", 4, "e3", "job.completed", "trainer-agent", "2026-01-01T00:00:09.0+00:00"),
              rec("job.queued", 7, "e1", "job.queued", "scheduler", "2026-01-01T00:00:01.0+00:00"),
              rec("job.queued", 7, "e1", "job.queued", "scheduler", "2026-01-01T00:00:01.0+00:00"),  # published twice
              rec("job.assigned", 2, "e2", "job.assigned", "scheduler", "2026-01-01T00:00:02.0+00:00")]
    deliveries = [delivery("registry", "e1", "2026-01-01T00:00:01.9+00:00", 0.9, 0.01),
                  delivery("metering", "e1", "2026-01-01T00:00:01.2+00:00", 0.2, 0.02),
                  delivery("trainer-agent", "e2", "2026-01-01T00:00:02.1+00:00", 0.1, 0.5),
                  delivery("eval", "e0", "2026-01-01T00:00:00.5+00:00", 0.5, 0.1, event_type="dataset.validated",
                           topic="dataset.validated", producer="ingest", produced_at="2026-01-01T00:00:00.0+00:00")]
    trace = build_trace(events, deliveries)
    assert [e.event_id for e in trace] == ["e0", "e1", "e2", "e3"]
    assert trace[1].copies == 2 and [c.service for c in trace[1].consumers] == ["metering", "registry"]
    assert trace[0].offset is None and trace[0].consumers[0].service == "eval"  # gone from the topic
    assert trace[3].consumers == [] and trace[1].publish_delay_s == pytest.approx(0.5)
    text = render("ftjob-1", trace, {"serving": "unreachable"})
    assert "job.assigned" in text and "-> trainer-agent" in text and "(no consumer recorded)" in text
    assert "longest hop: registry" in text and "serving did not answer" in text
    assert "(gone)" not in text and "dataset.validated @?*" in text and "1 event(s) without a place" in text
    assert render("ftjob-1", [], {}) == "no events found for ftjob-1"


def test_service_urls_explicit_beats_environment_beats_whet_dev_beats_defaults(tmp_path):
    assert service_urls(env={})["scheduler"] == "http://127.0.0.1:8100"
    assert service_urls(env={"WHETSTONE_TRAINER_AGENT_HTTP_PORT": "9"})["trainer-agent"] == "http://127.0.0.1:9"
    (tmp_path / "services.json").write_text(json.dumps({"scheduler": "http://127.0.0.1:5555", "eval": "http://e:1/"}))
    urls = service_urls(data_dir=tmp_path, env={"WHETSTONE_EVAL_URL": "http://eval.svc:8103"})
    assert urls["scheduler"] == "http://127.0.0.1:5555" and urls["eval"] == "http://eval.svc:8103"
    urls = service_urls(["eval=http://x:1"], data_dir=tmp_path, env={"WHETSTONE_EVAL_URL": "http://eval.svc:8103"})
    assert urls["eval"] == "http://x:1"
    with pytest.raises(SystemExit, match="NAME=http"):
        service_urls(["eval"], env={})
