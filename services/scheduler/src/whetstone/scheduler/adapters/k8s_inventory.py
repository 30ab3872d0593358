"""Node inventory from the Kubernetes API (kubernetes-asyncio).

GPU nodes are recognised by their labels (NVIDIA GPU feature discovery / GKE / EKS /
Karpenter conventions); a watch reports nodes that are added, changed (cordoned, tainted
for a spot interruption) or deleted, so the scheduler stops placing work there and
preempts the jobs on them before the node disappears.

`node_inventory` is a pure function of the Node object as JSON (what the API returns),
so it is tested on recorded API responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..domain.resources import canonical_gpu_type

PRODUCT_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator", "karpenter.k8s.aws/instance-gpu-name",
                  "node.kubernetes.io/gpu-type", "whetstone.io/gpu-type")
MEMORY_LABELS = ("nvidia.com/gpu.memory",)                       # MiB, from GPU feature discovery
COUNT_LABELS = ("nvidia.com/gpu.count",)
GROUP_LABELS = ("whetstone.io/interconnect-group", "nvidia.com/gpu.clique", "cloud.google.com/gke-placement-group",
                "topology.kubernetes.io/zone")
SPOT_LABELS = {
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "eks.amazonaws.com/capacityType": "SPOT",
    "karpenter.sh/capacity-type": "spot",
    "kubernetes.azure.com/scalesetpriority": "spot",
    "node.kubernetes.io/lifecycle": "spot",
}
# taints that announce the node is about to go away
INTERRUPTION_TAINTS = {
    "aws-node-termination-handler/spot-itn": "spot_loss",
    "aws-node-termination-handler/rebalance-recommendation": "spot_loss",
    "aws-node-termination-handler/asg-lifecycle-termination": "drain",
    "aws-node-termination-handler/scheduled-maintenance": "drain",
    "cloud.google.com/impending-node-termination": "spot_loss",
    "karpenter.sh/disrupted": "drain",
    "karpenter.sh/disruption": "drain",
    "ToBeDeletedByClusterAutoscaler": "drain",
    "node.kubernetes.io/unschedulable": "drain",
}


@dataclass(frozen=True)
class NodeInventory:
    node_id: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float
    spot: bool
    interconnect_group: str
    schedulable: bool
    unschedulable_reason: str | None       # spot_loss | drain | not_ready


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_inventory(obj: dict[str, Any]) -> NodeInventory | None:
    """A Node object (API JSON) -> its GPU inventory; None for nodes without GPUs."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    count = _int(allocatable.get("nvidia.com/gpu")) or next((_int(labels[k]) for k in COUNT_LABELS if k in labels), 0)
    product = next((labels[k] for k in PRODUCT_LABELS if labels.get(k)), None)
    if count <= 0 or not product:
        return None
    memory_mib = next((_int(labels[k]) for k in MEMORY_LABELS if k in labels), 0)
    spot = any(labels.get(k, "").lower() == v.lower() for k, v in SPOT_LABELS.items())
    group = next((labels[k] for k in GROUP_LABELS if labels.get(k)), "default")
    reason = None
    for taint in spec.get("taints") or []:
        if taint.get("key") in INTERRUPTION_TAINTS and taint.get("effect") in ("NoSchedule", "NoExecute"):
            reason = INTERRUPTION_TAINTS[taint["key"]]
            if reason == "spot_loss":
                break
    if reason is None and spec.get("unschedulable"):
        reason = "drain"
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "True")
    if reason is None and ready != "True":
        reason = "not_ready"
    return NodeInventory(meta["name"], canonical_gpu_type(product), count, round(memory_mib / 1024, 1), spot, group,
                         reason is None, reason)


@dataclass(frozen=True)
class NodeChange:
    kind: str                               # ADDED | MODIFIED | DELETED
    node: NodeInventory


class KubernetesInventory:
    """Lists and watches GPU nodes through a kubernetes_asyncio CoreV1Api."""

    def __init__(self, core_v1: Any, label_selector: str | None = None) -> None:
        self.api, self.selector = core_v1, label_selector
        self.resource_version: str | None = None

    async def list_nodes(self) -> list[NodeInventory]:
        kwargs = {"label_selector": self.selector} if self.selector else {}
        resp = await self.api.list_node(_preload_content=False, **kwargs)
        body = await resp.json()
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion")
        return [inv for item in body.get("items") or [] if (inv := node_inventory(item)) is not None]

    async def watch(self, timeout_seconds: int | None = None) -> AsyncIterator[NodeChange]:
        """Changes since the last list (resourceVersion); the client resumes after disconnects."""
        from kubernetes_asyncio import watch  # noqa: PLC0415

        kwargs: dict[str, Any] = {"allow_watch_bookmarks": True}
        if self.selector:
            kwargs["label_selector"] = self.selector
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        if timeout_seconds is not None:
            kwargs["timeout_seconds"] = timeout_seconds
        async with watch.Watch() as w:
            async for event in w.stream(self.api.list_node, **kwargs):
                if event["type"] == "BOOKMARK":
                    continue
                inv = node_inventory(event["raw_object"])
                if inv is not None:
                    yield NodeChange(event["type"], inv)
            self.resource_version = w.resource_version or self.resource_version


async def connect(host: str | None) -> Any:
    """A CoreV1Api: explicit host, else in-cluster service account, else ~/.kube/config."""
    from kubernetes_asyncio import client, config  # noqa: PLC0415

    if host:
        return client.CoreV1Api(client.ApiClient(client.Configuration(host=host)))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return client.CoreV1Api(client.ApiClient())
