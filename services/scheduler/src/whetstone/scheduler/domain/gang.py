"""The other nodes of a gang when one of its members ends the segment on its own. Pure.

A gang segment runs one rank group per node. When one node reports the segment failed or preempted
(its rank crashed, lost a peer, timed out in a collective, was preempted), the ranks on the other
nodes cannot go on alone: without a word from the scheduler they would sit in their next collective
until their own timeout, holding their GPUs. Each of them is sent `node.fenced` for the attempt: the
agent kills its rank group at once, reports nothing more of it, and the GPUs are free again.

A node that reports `node_lost` for a gang segment saw its collective break or time out (the process
group's timeout, WHETSTONE_TRAINER_AGENT_COLLECTIVE_TIMEOUT_S): the fault is on another node of the
gang, lost or hung. The job's events name those nodes (`lost_peers_note`).

Re-queues after a lost node are bounded (`max_node_lost_requeues`, an operator setting): a job whose
attempts keep losing nodes (a node that dies under it, a peer that always hangs) fails with the nodes
named instead of looping, and its GPUs are released (`lose_node`, `node_stopped`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from whetstone.contracts import Event, JobPreemptedV1, NodeFencedV1
from whetstone.contracts.enums import ErrorClass, PreemptionReason

from .job import Job

NODES_LOST = "nodes_lost"


def peers_to_stop(job: Job, reporter: str | None, segment_id: str | None) -> list[NodeFencedV1]:
    """`node.fenced` for every node of the job's current gang segment except `reporter`; nothing
    for a single-node segment or an event about another segment. Call it before the transition
    (which forgets the job's nodes)."""
    nodes = job.nodes_held()
    if len(nodes) < 2 or job.segment_id is None or segment_id != job.segment_id:
        return []
    return [NodeFencedV1(job_id=job.job_id, node_id=n, segment_id=job.segment_id, attempt=job.attempt,
                         reason=f"gang_member_ended:{reporter}") for n in nodes if n != reporter]


def lost_peers_note(job: Job, reporter: str | None, segment_id: str | None, reason: str) -> str | None:
    """The job event naming the nodes a gang member's `node_lost` report points at (every node of the
    current gang segment but the reporter); None for anything else. Call it before the transition."""
    nodes = job.nodes_held()
    if reason != PreemptionReason.NODE_LOST or len(nodes) < 2 or segment_id != job.segment_id:
        return None
    suspects = [n for n in nodes if n != reporter]
    if not suspects or reporter not in nodes:
        return None
    return (f"node {reporter} lost its gang peer: the collective with node(s) {', '.join(suspects)} broke or timed "
            f"out (lost or hung); attempt {job.attempt} stopped on every node of the gang and the job re-queued")


def count_node_loss(job: Job, lost: Sequence[str], limit: int) -> str | None:
    """Count one attempt of the job ended by the loss of `lost`; the failure message once the job was
    already re-queued `limit` times after lost nodes, else None (re-queue it)."""
    job.node_losses += 1
    job.lost_nodes = [*job.lost_nodes, *(n for n in dict.fromkeys(lost) if n not in job.lost_nodes)]
    if job.node_losses <= limit:
        return None
    return (f"attempt {job.attempt} ended with node(s) {', '.join(lost)} lost; the job had already been re-queued "
            f"{limit} times after lost nodes (the operator's bound), so it fails instead of looping. Nodes lost: "
            f"{', '.join(job.lost_nodes)}. Its GPUs are released")


def lose_node(job: Job, now: datetime, node_id: str, reason: str, position: int, limit: int) -> list[Event]:
    """The scheduler gives up on the job's attempt because `node_id` is gone (silent past the heartbeat
    timeout, or deleted): the attempt is fenced on every node of it (`Job.give_up_segment`) and the job
    re-queued; for `node_lost`, past `limit` such re-queues, it fails (platform, `nodes_lost`) instead."""
    verdict = None
    if reason == PreemptionReason.NODE_LOST and job.on_node:
        verdict = count_node_loss(job, [node_id], limit)
    events = job.give_up_segment(now, PreemptionReason(reason), position, node_id, requeue=verdict is None)
    if verdict is None:
        return events
    return [*events, *job.fail(now, NODES_LOST, verdict, ErrorClass.PLATFORM)]


def node_stopped(job: Job, now: datetime, ev: JobPreemptedV1, position: int, limit: int) -> list[Event]:
    """A node's own job.preempted for the job: re-queued (`Job.preempted`); a `node_lost` report of the
    current segment counts against `limit` and names the nodes it blames (a gang's other nodes, whose
    collective broke; or the reporter itself, an agent restarted after it was killed), failing the job
    past the bound. The caller fences the gang's other nodes either way (`peers_to_stop`)."""
    if ev.reason == PreemptionReason.NODE_LOST and job.on_node and ev.segment_id == job.segment_id:
        nodes = job.nodes_held()
        others = [n for n in nodes if n != ev.node_id]
        lost = others if ev.node_id in nodes and others else [ev.node_id or "unknown"]
        if verdict := count_node_loss(job, lost, limit):
            return job.fail(now, NODES_LOST, verdict, ErrorClass.PLATFORM)
    return job.preempted(now, ev.reason, ev.checkpoint, position)
