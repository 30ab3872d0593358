"""Vendors the JSON Schemas the production overlay is validated against (deploy/schemas/), offline after.

    python deploy/tools/vendor_schemas.py K8S_SCHEMA_DIR CRD.yaml...

K8S_SCHEMA_DIR: `kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict` from the
`kubernetes-validate` wheel (`pip download --no-deps kubernetes-validate`). CRD files: Strimzi
(install/cluster-operator/04x-Crd-*.yaml), KEDA (config/crd/bases/keda.sh_scaledobjects.yaml),
prometheus-operator (example/prometheus-operator-crd/monitoring.coreos.com_*.yaml).

Only the kinds the manifests use are kept (with the definitions they reach), without descriptions.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "schemas"
KUBERNETES_VERSION = "v1.33"
KINDS = {  # apiVersion/kind -> definition name in the Kubernetes OpenAPI
    "v1/Namespace": "io.k8s.api.core.v1.Namespace", "v1/ConfigMap": "io.k8s.api.core.v1.ConfigMap",
    "v1/Secret": "io.k8s.api.core.v1.Secret", "v1/Service": "io.k8s.api.core.v1.Service",
    "v1/ServiceAccount": "io.k8s.api.core.v1.ServiceAccount",
    "apps/v1/Deployment": "io.k8s.api.apps.v1.Deployment", "apps/v1/DaemonSet": "io.k8s.api.apps.v1.DaemonSet",
    "networking.k8s.io/v1/Ingress": "io.k8s.api.networking.v1.Ingress",
    "networking.k8s.io/v1/NetworkPolicy": "io.k8s.api.networking.v1.NetworkPolicy",
    "policy/v1/PodDisruptionBudget": "io.k8s.api.policy.v1.PodDisruptionBudget",
    "rbac.authorization.k8s.io/v1/ClusterRole": "io.k8s.api.rbac.v1.ClusterRole",
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding": "io.k8s.api.rbac.v1.ClusterRoleBinding",
}
REF = re.compile(r"^/api/_definitions\.json#/\$defs/(.+)$")


def strip(node, drop=("description",)):
    if isinstance(node, dict):
        return {k: strip(v, drop) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [strip(v, drop) for v in node]
    return node


def kubernetes(schema_dir: Path) -> dict:
    defs = json.loads((schema_dir / "_definitions.json").read_text())["$defs"]
    keep: dict[str, dict] = {}
    todo = list(KINDS.values())
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = strip(defs[name])
        text = json.dumps(keep[name])
        todo += [m for m in re.findall(r'"(?:/api/_definitions\.json)?#/\$defs/([^"]+)"', text) if m not in keep]
    text = json.dumps({"kinds": {k: f"#/$defs/{v}" for k, v in KINDS.items()}, "$defs": keep}, sort_keys=True)
    return json.loads(text.replace("/api/_definitions.json#/$defs/", "#/$defs/"))


def crd(path: Path) -> tuple[str, dict]:
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    key = f"{spec['group']}/{version['name']}/{spec['names']['kind']}"
    return key, strip(version["schema"]["openAPIV3Schema"])


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"kubernetes-{KUBERNETES_VERSION}.json").write_text(json.dumps(kubernetes(Path(argv[0])), sort_keys=True))
    crds = dict(crd(Path(p)) for p in argv[1:])
    (OUT / "crds.json").write_text(json.dumps(crds, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
