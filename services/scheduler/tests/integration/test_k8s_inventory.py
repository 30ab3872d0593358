"""The Kubernetes inventory adapter with the real kubernetes-asyncio client against recorded API responses."""

import pytest

from whetstone.scheduler.adapters.k8s_inventory import KubernetesInventory, connect

pytestmark = pytest.mark.integration


async def test_list_then_watch_a_spot_interruption(kube_api):
    api = await connect(kube_api.url)
    try:
        inventory = KubernetesInventory(api, "nvidia.com/gpu.present=true")
        nodes = {n.node_id: n for n in await inventory.list_nodes()}
        assert len(nodes) == 5 and inventory.resource_version == "118260"
        assert kube_api.queries[0]["labelSelector"] == "nvidia.com/gpu.present=true"
        kube_api.release.set()
        changes = [c async for c in inventory.watch(timeout_seconds=2)]
        assert kube_api.queries[1]["resourceVersion"] == "118260"
        assert [(c.kind, c.node.node_id) for c in changes] == [
            ("MODIFIED", "ip-10-0-1-12.ec2.internal"), ("MODIFIED", "ip-10-0-3-21.ec2.internal"),
            ("DELETED", "ip-10-0-1-12.ec2.internal")]
        assert changes[0].node.unschedulable_reason == "spot_loss" and changes[1].node.schedulable
        assert inventory.resource_version == "118420"
    finally:
        await api.api_client.close()
