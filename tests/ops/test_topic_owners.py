"""The contracts' topic table says which service produces and consumes each topic, and the Kafka ACLs
are made from it alone (deploy/tools/kafka_resources.py). Here the services' code is held to the
table: a service subscribes to exactly the topics the table gives it, and constructs events only of
topics it produces (its product code: sample events kept for tests live in whetstone.devstack)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from whetstone.contracts import TOPICS, ServiceName

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {ServiceName.INGEST: "whetstone.ingest", ServiceName.SCHEDULER: "whetstone.scheduler",
            ServiceName.TRAINER_AGENT: "whetstone.trainer_agent", ServiceName.EVAL: "whetstone.eval",
            ServiceName.REGISTRY: "whetstone.registry", ServiceName.METERING: "whetstone.metering",
            ServiceName.SERVING: "whetstone.serving"}
EVENT_CLASS = re.compile(r"\b([A-Z]\w*V\d+)\(")


def source_dir(svc: ServiceName) -> Path:
    return ROOT / "services" / svc.value / "src" / Path(*PACKAGES[svc].split("."))


def subscriptions(svc: ServiceName) -> set[str]:
    """The topics the service's bootstrap subscribes to: the live Service, or the literal in its
    source when building it needs a configured environment."""
    try:
        return set(importlib.import_module(f"{PACKAGES[svc]}.bootstrap").build_service().subscriptions)
    except Exception:
        source = (source_dir(svc) / "bootstrap.py").read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.keyword) and node.arg == "subscriptions" and isinstance(node.value, ast.Dict):
                return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        raise


def constructed(svc: ServiceName) -> set[str]:
    """The topics whose event classes the service's product code constructs."""
    by_class = {t.model.__name__: name for name, t in TOPICS.items()}
    found: set[str] = set()
    for path in source_dir(svc).rglob("*.py"):
        found |= {by_class[m] for m in EVENT_CLASS.findall(path.read_text()) if m in by_class}
    return found


@pytest.mark.parametrize("svc", list(PACKAGES), ids=str)
def test_a_service_consumes_and_produces_what_the_topic_table_says(svc: ServiceName) -> None:
    consumes = {t.name for t in TOPICS.values() if svc in t.consumers}
    produces = {t.name for t in TOPICS.values() if svc in t.producers}
    assert subscriptions(svc) == consumes, f"{svc} subscribes to other topics than contracts.TOPICS lists for it"
    assert constructed(svc) == produces, f"{svc} constructs events of other topics than contracts.TOPICS lists for it"


def test_every_party_of_the_table_is_a_known_service() -> None:
    parties = {s for t in TOPICS.values() for s in t.producers | t.consumers}
    assert parties <= set(PACKAGES) | {ServiceName.EXTERNAL}
    assert all(t.producers for t in TOPICS.values()), "a topic nobody produces"
    assert [t.name for t in TOPICS.values() if ServiceName.EXTERNAL in t.producers] == ["job.requested"]


def test_the_scan_sees_the_known_producers() -> None:
    assert "eval.completed" in constructed(ServiceName.EVAL)
    assert {"job.queued", "job.assigned"} <= constructed(ServiceName.SCHEDULER)
    assert {"checkpoint.written", "node.heartbeat", "job.progress"} <= constructed(ServiceName.TRAINER_AGENT)
    assert "usage.metered" in constructed(ServiceName.METERING)
    assert constructed(ServiceName.SERVING) == set()   # its sample events moved to whetstone.devstack
