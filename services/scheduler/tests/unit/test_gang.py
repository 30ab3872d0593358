"""When one node of a gang ends the segment, the scheduler stops the ranks on the others (node.fenced)."""

from whetstone.scheduler.domain.gang import peers_to_stop


class _Job:
    """The three things `peers_to_stop` reads of a job."""

    def __init__(self, nodes: list[str], segment_id: str | None = "job-1-s2", attempt: int = 2) -> None:
        self.job_id, self.segment_id, self.attempt, self._nodes = "job-1", segment_id, attempt, nodes

    def nodes_held(self) -> list[str]:
        return list(self._nodes)


def test_every_other_node_of_the_gang_is_fenced_for_the_attempt():
    fences = peers_to_stop(_Job(["node-a", "node-b", "node-c"]), "node-b", "job-1-s2")   # type: ignore[arg-type]
    assert [(f.node_id, f.segment_id, f.attempt) for f in fences] == [("node-a", "job-1-s2", 2),
                                                                       ("node-c", "job-1-s2", 2)]
    assert all(f.reason == "gang_member_ended:node-b" for f in fences)


def test_single_node_jobs_and_other_segments_stop_nothing():
    assert peers_to_stop(_Job(["node-a"]), "node-a", "job-1-s2") == []                      # type: ignore[arg-type]
    assert peers_to_stop(_Job(["node-a", "node-b"]), "node-a", "job-1-s1") == []           # type: ignore[arg-type]
    assert peers_to_stop(_Job(["node-a", "node-b"], segment_id=None), "node-a", None) == []  # type: ignore[arg-type]
