"""The runtime's Observer runs the event metrics a service declares, on what its units of work
committed: the typed event the producer handed over, or the envelope's payload parsed into it."""

import pytest
from prometheus_client import CollectorRegistry
from whetstone.contracts import DatasetValidatedV1, JobFailedV1
from whetstone.runtime.messaging import Published, make_envelope
from whetstone.runtime.observability import EventMetric, MetricSet, Observer

pytestmark = pytest.mark.unit


def failures(m: MetricSet) -> dict[str, EventMetric]:
    failed = m.counter("test_jobs_failed_total", "failures", ["error_class", "code"])

    def job_failed(published: Published) -> None:
        ev = published.read(JobFailedV1)
        failed.labels(error_class=m.cap("error_class", ev.error_class), code=m.cap("code", ev.code)).inc()

    return {JobFailedV1.EVENT_TYPE: job_failed}


def test_the_services_event_metrics_count_what_was_committed() -> None:
    reg = CollectorRegistry()
    observer = Observer(reg, "svc", event_metrics=failures)
    event = JobFailedV1(job_id="ftjob-1", error_class="user", code="oom", message="out of memory")
    env = make_envelope(event, producer="svc", tenant_id="demo")
    other = make_envelope(DatasetValidatedV1(dataset_id="ds-1", version="v", name="n", status="accepted"),
                          producer="svc", tenant_id="demo")
    observer.committed([Published(env, event), Published(env), Published(other)])
    assert reg.get_sample_value("test_jobs_failed_total", {"error_class": "user", "code": "oom"}) == 2


def test_a_payload_the_metrics_cannot_read_is_counted_not_raised() -> None:
    reg = CollectorRegistry()
    observer = Observer(reg, "svc", event_metrics=failures)
    env = make_envelope(JobFailedV1(job_id="ftjob-1", error_class="user", code="oom", message="m"),
                        producer="svc", tenant_id="demo")
    broken = env.model_copy(update={"payload": {"job_id": "ftjob-1"}})
    observer.committed([Published(broken)])
    assert reg.get_sample_value("whetstone_observability_errors_total",
                                {"service": "svc", "source": "event_metrics"}) == 1
