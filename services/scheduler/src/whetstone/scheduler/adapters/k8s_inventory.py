"""Node inventory from the Kubernetes API (kubernetes-asyncio).

GPU nodes are recognised by their labels (NVIDIA GPU feature discovery / GKE / EKS /
Karpenter conventions); a watch reports nodes that are added, changed (cordoned, tainted
for a spot interruption) or deleted, so the scheduler stops placing work there and
preempts the jobs on them before the node disappears.

The API's JSON is read into small models of the fields used (`KubeNode`, `NodeList`, `WatchEvent`);
`node_inventory` is a pure function of a `KubeNode`, so it is tested on recorded API responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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


class _Kube(BaseModel):
    """The fields of a Kubernetes API object this module reads; the rest is ignored."""
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class ObjectMeta(_Kube):
    name: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class Taint(_Kube):
    key: str
    effect: str = ""


class NodeSpec(_Kube):
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False


class NodeCondition(_Kube):
    type: str
    status: str


class NodeStatus(_Kube):
    allocatable: dict[str, str] = Field(default_factory=dict)
    capacity: dict[str, str] = Field(default_factory=dict)
    conditions: list[NodeCondition] = Field(default_factory=list)


class KubeNode(_Kube):
    """A Node object as the API returns it (JSON)."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)


class ListMeta(_Kube):
    resource_version: str | None = Field(default=None, alias="resourceVersion")


class NodeList(_Kube):
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[KubeNode] = Field(default_factory=list)


class WatchEvent(_Kube):
    """One event of a kubernetes_asyncio watch stream: its type and the object's JSON."""
    type: str                               # ADDED | MODIFIED | DELETED | BOOKMARK
    raw_object: KubeNode


def _int(value: str | None) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_inventory(node: KubeNode) -> NodeInventory | None:
    """A Node object -> its GPU inventory; None for nodes without GPUs."""
    labels, spec, status = node.metadata.labels, node.spec, node.status
    allocatable = status.allocatable or status.capacity
    count = _int(allocatable.get("nvidia.com/gpu")) or next((_int(labels[k]) for k in COUNT_LABELS if k in labels), 0)
    product = next((labels[k] for k in PRODUCT_LABELS if labels.get(k)), None)
    if count <= 0 or not product:
        return None
    memory_mib = next((_int(labels[k]) for k in MEMORY_LABELS if k in labels), 0)
    spot = any(labels.get(k, "").lower() == v.lower() for k, v in SPOT_LABELS.items())
    group = next((labels[k] for k in GROUP_LABELS if labels.get(k)), "default")
    reason = None
    for taint in spec.taints:
        if taint.key in INTERRUPTION_TAINTS and taint.effect in ("NoSchedule", "NoExecute"):
            reason = INTERRUPTION_TAINTS[taint.key]
            if reason == "spot_loss":
                break
    if reason is None and spec.unschedulable:
        reason = "drain"
    ready = next((c.status for c in status.conditions if c.type == "Ready"), "True")
    if reason is None and ready != "True":
        reason = "not_ready"
    return NodeInventory(node.metadata.name, canonical_gpu_type(product), count, round(memory_mib / 1024, 1), spot,
                         group, reason is None, reason)


@dataclass(frozen=True)
class NodeChange:
    kind: str                               # ADDED | MODIFIED | DELETED
    node: NodeInventory


@dataclass(frozen=True)
class WatchOptions:
    """What a node watch asks for: bookmarks always, the selector, resourceVersion and timeout when set."""
    label_selector: str | None
    resource_version: str | None
    timeout_seconds: int | None

    def kwargs(self) -> dict[str, str | int | bool]:
        given = {"label_selector": self.label_selector, "resource_version": self.resource_version or None,
                 "timeout_seconds": self.timeout_seconds}
        return {"allow_watch_bookmarks": True, **{k: v for k, v in given.items() if v is not None}}


class KubernetesInventory:
    """Lists and watches GPU nodes through a kubernetes_asyncio CoreV1Api."""

    def __init__(self, core_v1: Any, label_selector: str | None = None) -> None:
        self.api, self.selector = core_v1, label_selector
        self.resource_version: str | None = None

    async def list_nodes(self) -> list[NodeInventory]:
        kwargs = {"label_selector": self.selector} if self.selector else {}
        resp = await self.api.list_node(_preload_content=False, **kwargs)
        nodes = NodeList.model_validate(await resp.json())
        self.resource_version = nodes.metadata.resource_version
        return [inv for item in nodes.items if (inv := node_inventory(item)) is not None]

    async def watch(self, timeout_seconds: int | None = None) -> AsyncIterator[NodeChange]:
        """Changes since the last list (resourceVersion); the client resumes after disconnects."""
        from kubernetes_asyncio import watch  # noqa: PLC0415

        options = WatchOptions(self.selector, self.resource_version, timeout_seconds)
        async with watch.Watch() as w:
            async for raw in w.stream(self.api.list_node, **options.kwargs()):
                event = WatchEvent.model_validate(raw)
                if event.type == "BOOKMARK":
                    continue
                inv = node_inventory(event.raw_object)
                if inv is not None:
                    yield NodeChange(event.type, inv)
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
