"""The other nodes of a gang when one of its members ends the segment on its own. Pure.

A gang segment runs one rank group per node. When one node reports the segment failed or preempted
(its rank crashed, lost a peer, timed out in a collective, was preempted), the ranks on the other
nodes cannot go on alone: without a word from the scheduler they would sit in their next collective
until their own timeout, holding their GPUs. Each of them is sent `node.fenced` for the attempt: the
agent kills its rank group at once, reports nothing more of it, and the GPUs are free again.

A node that reports `node_lost` for a gang segment saw its collective break or time out (the process
group's timeout, WHETSTONE_TRAINER_AGENT_COLLECTIVE_TIMEOUT_S): the fault is on another node of the
gang, lost or hung. The job's events name those nodes (`lost_peers_note`).
"""

from __future__ import annotations

from whetstone.contracts import NodeFencedV1
from whetstone.contracts.enums import PreemptionReason

from .job import Job


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
