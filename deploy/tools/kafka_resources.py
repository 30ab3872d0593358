"""Generates deploy/kafka/topics.yaml and deploy/kafka/users.yaml (Strimzi) from the code.

    .venv/bin/python deploy/tools/kafka_resources.py          # write
    .venv/bin/python deploy/tools/kafka_resources.py --check  # exit 1 when out of date

* one KafkaTopic per entry of `whetstone.contracts.TOPICS` and one per DLQ, with partitions and
  retention from the contracts table;
* one KafkaUser per service, SCRAM-SHA-512, ACLs for exactly the topics its code consumes
  (`bootstrap.build_service().subscriptions`, read from the bootstrap's source when building it needs
  a configured environment) and publishes (the event classes its code constructs, plus the DLQ of every
  topic it consumes: the runtime dead-letters there), its consumer group, and Describe on the
  `whetstone-dlq-review` group (the metrics collector reads its offsets);
* one KafkaUser for external producers, allowed to write `job.requested` only.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generated import write_or_check  # noqa: E402

import yaml

from whetstone.contracts import TOPICS
from whetstone.runtime.observability import DLQ_REVIEW_GROUP

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy" / "kafka"
CLUSTER = "whetstone"
# service -> (package directory, python package); group: consumer group (prefix for per-node groups)
SERVICES = {
    "ingest": ("ingest", "whetstone.ingest"), "scheduler": ("scheduler", "whetstone.scheduler"),
    "trainer-agent": ("trainer-agent", "whetstone.trainer_agent"), "eval": ("eval", "whetstone.eval"),
    "registry": ("registry", "whetstone.registry"), "metering": ("metering", "whetstone.metering"),
    "serving": ("serving", "whetstone.serving"),
}
EXTERNAL_PRODUCER_TOPICS = ("job.requested",)
EVENT_CLASS = re.compile(r"\b([A-Z]\w*V\d+)\(")


@dataclass
class Access:
    service: str
    group: str
    group_prefix: bool
    consumes: list[str] = field(default_factory=list)
    publishes: list[str] = field(default_factory=list)


def subscriptions(svc: str) -> tuple[list[str], str | None]:
    pkg_dir, pkg = SERVICES[svc]
    try:
        service = importlib.import_module(f"{pkg}.bootstrap").build_service()
        return sorted(service.subscriptions), service.group_id
    except Exception:  # needs a configured environment: read the literal from the source
        source = (ROOT / "services" / pkg_dir / "src" / Path(*pkg.split(".")) / "bootstrap.py").read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.keyword) and node.arg == "subscriptions" and isinstance(node.value, ast.Dict):
                return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant)), None
        raise


def publications(svc: str) -> list[str]:
    by_class = {t.model.__name__: name for name, t in TOPICS.items()}
    src = ROOT / "services" / SERVICES[svc][0] / "src"
    found: set[str] = set()
    for path in src.rglob("*.py"):
        found |= {by_class[m] for m in EVENT_CLASS.findall(path.read_text()) if m in by_class}
    return sorted(found)


def access(svc: str) -> Access:
    consumes, group = subscriptions(svc)
    prefix = svc == "trainer-agent"  # one group per node: whetstone-trainer-agent-<node>
    return Access(svc, group if group and not prefix else f"whetstone-{svc}", prefix, consumes,
                  sorted(set(publications(svc)) | {TOPICS[t].dlq for t in consumes}))


def kafka_topic(name: str, partitions: int, hours: int) -> dict:
    return {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaTopic",
            "metadata": {"name": name.replace(".", "-").replace("_", "-"), "labels": {"strimzi.io/cluster": CLUSTER}},
            "spec": {"topicName": name, "partitions": partitions, "replicas": 3,
                     "config": {"retention.ms": str(hours * 3600 * 1000), "min.insync.replicas": "2",
                                "cleanup.policy": "delete"}}}


def topics() -> list[dict]:
    out = []
    for t in TOPICS.values():
        out += [kafka_topic(t.name, t.partitions, t.retention_hours), kafka_topic(t.dlq, 1, t.dlq_retention_hours)]
    return out


def acl(kind: str, name: str, ops: list[str], pattern: str = "literal") -> dict:
    return {"resource": {"type": kind, "name": name, "patternType": pattern}, "operations": ops}


def kafka_user(name: str, acls: list[dict]) -> dict:
    return {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaUser",
            "metadata": {"name": name, "labels": {"strimzi.io/cluster": CLUSTER}},
            "spec": {"authentication": {"type": "scram-sha-512"},
                     "authorization": {"type": "simple", "acls": acls}}}


def users() -> list[dict]:
    out = []
    for svc in SERVICES:
        a = access(svc)
        acls = [acl("topic", t, ["Read", "Describe"]) for t in a.consumes]
        acls += [acl("topic", t, ["Write", "Describe"]) for t in a.publishes]
        if a.consumes:
            acls.append(acl("group", a.group, ["Read", "Describe"], "prefix" if a.group_prefix else "literal"))
            acls.append(acl("group", DLQ_REVIEW_GROUP, ["Describe"]))
        out.append(kafka_user(f"whetstone-{svc}", acls))
    out.append(kafka_user("whetstone-external-producer",
                          [acl("topic", t, ["Write", "Describe"]) for t in EXTERNAL_PRODUCER_TOPICS]))
    return out


HEADER = "# GENERATED by deploy/tools/kafka_resources.py from the code: do not edit.\n"


def render() -> dict[str, str]:
    dump = lambda docs: HEADER + yaml.safe_dump_all(docs, sort_keys=False)  # noqa: E731
    return {"topics.yaml": dump(topics()), "users.yaml": dump(users())}


def main(argv: list[str]) -> int:
    return write_or_check(render(), OUT, "kafka_resources.py", argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
