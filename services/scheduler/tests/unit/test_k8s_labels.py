"""GPU inventory from recorded Kubernetes Node objects (labels, allocatable, taints, cordons)."""

import json
from pathlib import Path

import pytest

from whetstone.scheduler.adapters.k8s_inventory import KubeNode, NodeList, WatchOptions, node_inventory

pytestmark = pytest.mark.unit
FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"


def inventory() -> dict:
    nodes = NodeList.model_validate_json((FIXTURES / "nodelist.json").read_text())
    return {i.node_id: i for item in nodes.items if (i := node_inventory(item)) is not None}


def test_gpu_nodes_from_feature_discovery_and_cloud_labels():
    inv = inventory()
    assert "ip-10-0-2-40.ec2.internal" not in inv                     # CPU-only node ignored
    od, spot = inv["ip-10-0-1-11.ec2.internal"], inv["ip-10-0-1-12.ec2.internal"]
    assert (od.gpu_type, od.gpu_count, od.gpu_memory_gb, od.spot) == ("A100", 8, 80.0, False)
    assert spot.spot and spot.interconnect_group == od.interconnect_group == "efa-use1a-1"
    gke = inv["gke-train-h100-spot-7f3c9a21-x2vq"]
    assert (gke.gpu_type, gke.gpu_count, gke.spot, gke.interconnect_group) == ("H100", 8, True, "h100-compact-1")
    assert gke.schedulable                                             # the nvidia.com/gpu taint is routine


def test_cordoned_and_not_ready_nodes_are_unschedulable():
    inv = inventory()
    l4, t4 = inv["ip-10-0-3-21.ec2.internal"], inv["ip-10-0-3-22.ec2.internal"]
    assert (l4.gpu_type, l4.gpu_count, l4.schedulable, l4.unschedulable_reason) == ("L4", 4, False, "drain")
    assert (t4.gpu_type, t4.spot, t4.schedulable, t4.unschedulable_reason) == ("T4", True, False, "not_ready")


def test_spot_interruption_taint_in_a_watch_event():
    events = [json.loads(line) for line in (FIXTURES / "watch_spot_interruption.jsonl").read_text().splitlines()]
    tainted = node_inventory(KubeNode.model_validate(events[0]["object"]))
    assert tainted.node_id == "ip-10-0-1-12.ec2.internal" and tainted.unschedulable_reason == "spot_loss"
    assert node_inventory(KubeNode.model_validate(events[2]["object"])).schedulable   # uncordoned


def test_watch_asks_only_for_what_is_set():
    assert WatchOptions(None, "", None).kwargs() == {"allow_watch_bookmarks": True}
    assert WatchOptions("gpu=true", "42", 5).kwargs() == {"allow_watch_bookmarks": True, "label_selector": "gpu=true",
                                                         "resource_version": "42", "timeout_seconds": 5}
