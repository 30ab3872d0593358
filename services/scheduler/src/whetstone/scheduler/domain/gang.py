"""The other nodes of a gang when one of its members ends the segment on its own. Pure.

A gang segment runs one rank group per node. When one node reports the segment failed or preempted
(its rank crashed, lost a peer, timed out in a collective, was preempted), the ranks on the other
nodes cannot go on alone: without a word from the scheduler they would sit in their next collective
until their own timeout, holding their GPUs. Each of them is sent `node.fenced` for the attempt: the
agent kills its rank group at once, reports nothing more of it, and the GPUs are free again.
"""

from __future__ import annotations

from whetstone.contracts import NodeFencedV1

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
