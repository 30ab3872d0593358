"""A gang's faults, the agent's pure rules (issue 40): a stopped non-zero rank leaves the report to rank 0,
the rendezvous port is checked before launch, nodes of different platform builds refuse to train together,
the process group's timeout is the operator's setting, and the test faults that hang or slow a rank."""

from __future__ import annotations

import json
import socket

import pytest
from whetstone.contracts.enums import ErrorClass, PreemptionReason
from whetstone.trainer_agent.adapters.processes import port_in_use
from whetstone.trainer_agent.domain.distributed import DistributedPlan
from whetstone.trainer_agent.domain.launch import (
    COLLECTIVE_TIMEOUT_ENV,
    Rendezvous,
    build_launch,
    port_taken_message,
    rendezvous_port,
)
from whetstone.trainer_agent.domain.supervision import classify_exit, gang_peer_lost
from whetstone.trainer_agent.recipes.errors import PlatformError
from whetstone.trainer_agent.recipes.faults import Faults
from whetstone.trainer_agent.recipes.gang_check import version_mismatch
from whetstone.trainer_agent.recipes.trainers import collective_timeout_s

pytestmark = pytest.mark.unit
CPU = DistributedPlan("lora", 2, None)


def test_a_stopped_worker_node_leaves_the_gangs_report_to_rank_0_whatever_its_launchers_exit():
    # torchrun exits 1 on SIGTERM; the drained (or preempt-requested) worker node still says nothing
    for code in (0, 1, -15):
        drained = classify_exit(code, cancelled=False, stopping=PreemptionReason.SPOT_LOSS, worker_node=True,
                                log_tail="SignalException")
        requested = classify_exit(code, cancelled=False, stopping=None, worker_node=True, log_tail="",
                                  stop_requested=True)
        assert drained.outcome == requested.outcome == "worker_done", (code, drained, requested)
    # rank 0's node reports the stop itself; an unasked worker's crash is still a failure; a cancel wins
    assert classify_exit(1, cancelled=False, stopping=PreemptionReason.DRAIN, worker_node=False,
                         log_tail="").outcome == "preempted"
    assert classify_exit(1, cancelled=False, stopping=None, worker_node=True, log_tail="").outcome == "failed"
    assert classify_exit(1, cancelled=True, stopping=None, worker_node=True, log_tail="",
                         stop_requested=True).code == "cancelled"


def test_only_the_node_hosting_the_rendezvous_checks_its_port():
    def launch(node_rank: int, nodes: int = 2):
        return build_launch(python="py", module="m", config_path="c", plan=CPU, gpu_ids=[0], gpu_node=False,
                            key="ftjob-1-s1", rendezvous=Rendezvous("10.0.0.1", 29511, node_rank, nodes))
    assert rendezvous_port(launch(0), 0) == 29511
    assert rendezvous_port(launch(1), 1) is None
    assert rendezvous_port(launch(0, nodes=1), 0) is None        # one plain process meets nobody
    message = port_taken_message("node-a", 29511)
    assert "node node-a" in message and "29511" in message


def test_a_port_held_by_another_process_is_seen_as_taken():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port_in_use(port)
    assert not port_in_use(port)     # released: free again (SO_REUSEADDR: TIME_WAIT does not count)


def test_nodes_of_different_platform_builds_refuse_to_train_together_naming_the_odd_node():
    same = [("node-a", "sha256:aa"), ("node-a", "sha256:aa"), ("node-b", "sha256:aa")]
    assert version_mismatch(same) is None and version_mismatch([]) is None
    problem = version_mismatch([("node-a", "sha256:aa"), ("node-b", "sha256:bb"), ("node-b", "sha256:bb")])
    assert problem is not None
    assert "node node-b runs sha256:bb" in problem and "node node-a (rank 0) runs sha256:aa" in problem
    assert problem.count("node-b") == 1                           # one mention per node, not per rank
    assert not gang_peer_lost(2, ErrorClass.PLATFORM, problem)    # a failure of the job, not a lost peer


def test_the_process_group_timeout_is_the_agents_setting(monkeypatch):
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert collective_timeout_s() == 1800
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "12")
    assert collective_timeout_s() == 12
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "soon")
    with pytest.raises(PlatformError, match=COLLECTIVE_TIMEOUT_ENV):
        collective_timeout_s()


def test_hang_and_delay_faults_switch_the_hooks_on(monkeypatch):
    monkeypatch.setenv("WHETSTONE_RECIPE_FAULTS", json.dumps({"hang_after_forward": 3, "forward_delay_s": 0.5}))
    faults = Faults.from_env()
    assert faults.active and faults.hang_after_forward == 3 and faults.forward_delay_s == 0.5


def test_a_node_that_never_joins_fails_the_gang_within_the_join_timeout():
    gang = build_launch(python="py", module="m", config_path="c", plan=CPU, gpu_ids=[0], gpu_node=False,
                        key="ftjob-1-s1", rendezvous=Rendezvous("10.0.0.1", 29511, 0, 2), join_timeout_s=30)
    assert "--rdzv-conf=timeout=30" in gang.argv
    alone = build_launch(python="py", module="m", config_path="c", plan=DistributedPlan("lora", 2, 2),
                         gpu_ids=[0, 1], gpu_node=True, key="ftjob-1-s1", join_timeout_s=30)
    assert not any(a.startswith("--rdzv-conf") for a in alone.argv)    # one node: nobody to wait for
    # what rank 0's launcher prints then (torch's static rendezvous) is read as a lost peer: re-queued
    tail = ("training process exited with code 1 without reporting a result; log tail:\n"
            "torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. 1/2 clients joined.")
    assert gang_peer_lost(2, ErrorClass.PLATFORM, tail)
