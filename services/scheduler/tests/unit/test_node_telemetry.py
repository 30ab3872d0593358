"""The heartbeats' hardware figures as gauges per node: GPU figures aggregated over a node's GPUs,
CPU figures when there are no GPUs, a silent node dropping out; and the queue-wait histogram."""

import pytest
from prometheus_client import generate_latest

from whetstone.contracts.platform_events import GpuSample
from whetstone.scheduler.adapters.metrics import NodeFigures, SchedulerMetrics

pytestmark = pytest.mark.unit


def samples(m: SchedulerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in m.registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_gauges_per_node_from_the_last_heartbeat():
    m = SchedulerMetrics()
    now = [1000.0]
    m.nodes.clock = lambda: now[0]
    gpus = (GpuSample(index=0, utilization_pct=90.0, memory_used_mb=1024.0, memory_total_mb=81559.0,
                      power_w=600.0, temperature_c=60.0),
            GpuSample(index=1, utilization_pct=10.0, memory_used_mb=1024.0, memory_total_mb=81559.0,
                      power_w=None, temperature_c=70.0))
    m.nodes.observe("gpu-1", "H100", NodeFigures(gpus, cpu_percent=12.5, rss_mb=512.0))
    m.nodes.observe("cpu-1", "cpu", NodeFigures((), cpu_percent=50.0, rss_mb=100.0))
    got = samples(m)
    gpu1 = (("gpu_type", "H100"), ("node", "gpu-1"))
    assert got[("whetstone_node_gpu_utilization_ratio", gpu1)] == pytest.approx(0.5)
    assert got[("whetstone_node_gpu_memory_used_bytes", gpu1)] == 2048 * 2**20
    assert got[("whetstone_node_gpu_power_watts", gpu1)] == 600.0   # the unreadable one left out
    assert got[("whetstone_node_gpu_temperature_celsius", gpu1)] == 70.0
    cpu1 = (("gpu_type", "cpu"), ("node", "cpu-1"))
    assert got[("whetstone_node_cpu_utilization_ratio", cpu1)] == 0.5
    assert got[("whetstone_node_agent_rss_bytes", cpu1)] == 100 * 2**20
    assert ("whetstone_node_gpu_utilization_ratio", cpu1) not in got
    now[0] += 301   # both silent past the ttl: gone, the families stay declared
    assert not [k for k in samples(m) if k[0].startswith("whetstone_node_")]
    assert b"# TYPE whetstone_node_gpu_utilization_ratio gauge" in generate_latest(m.registry)


def test_queue_wait_by_tier():
    m = SchedulerMetrics()
    m.queue_wait.labels(tier="premium").observe(3.0)
    m.queue_wait.labels(tier="free").observe(4000.0)
    got = samples(m)
    assert got[("whetstone_scheduler_queue_wait_seconds_count", (("tier", "premium"),))] == 1
    assert got[("whetstone_scheduler_queue_wait_seconds_bucket", (("le", "5.0"), ("tier", "premium")))] == 1
    assert got[("whetstone_scheduler_queue_wait_seconds_bucket", (("le", "3600.0"), ("tier", "free")))] == 0
