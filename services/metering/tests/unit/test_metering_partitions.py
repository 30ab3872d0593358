"""A replica owns the jobs of the partition numbers it holds of every lifecycle topic."""

from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.partitioner import DefaultPartitioner

from whetstone.metering.adapters.partitions import Ownership, key_hash, ownership

TOPICS = ("job.queued", "job.started", "job.completed")


def test_the_key_hash_gives_the_partition_kafkas_default_partitioner_picks():
    partitions = list(range(3))
    for job_id in ("ftjob-a", "ftjob-0001", "ftjob-é", "x" * 200):
        assert key_hash(job_id) % 3 == DefaultPartitioner()(job_id.encode(), partitions, partitions)
        assert 0 <= key_hash(job_id) < 2**31  # fits a Postgres int


def test_a_range_assignment_gives_each_replica_whole_jobs():
    counts = dict.fromkeys(TOPICS, 3)
    first = ownership([(t, p) for t in TOPICS for p in (0, 1)], counts, TOPICS)
    second = ownership([(t, 2) for t in TOPICS], counts, TOPICS)
    assert first == Ownership(3, frozenset({0, 1})) and second == Ownership(3, frozenset({2}))
    jobs = [f"ftjob-{i}" for i in range(50)]
    assert all(first.owns(j) != second.owns(j) for j in jobs)


def test_the_range_assignor_hands_out_the_same_partition_numbers_of_every_topic():
    class Cluster:
        def partitions_for_topic(self, topic):
            return {0, 1, 2}

    class Member:
        def __init__(self, topics):
            self.subscription = topics

    split = RangePartitionAssignor.assign(Cluster(), {"a": Member(list(TOPICS)), "b": Member(list(TOPICS))})
    for assignment in split.values():
        held = {t: set(p) for t, p in assignment.assignment}
        assert len({frozenset(p) for p in held.values()}) == 1, held


def test_no_ownership_without_a_whole_partition_number_or_with_uneven_topics():
    counts = dict.fromkeys(TOPICS, 3)
    # partition 0 of two topics only (a round-robin split): no job has all its events here
    assert ownership([("job.queued", 0), ("job.started", 0), ("job.completed", 1)], counts, TOPICS) is None
    assert ownership([], counts, TOPICS) is None
    everything = [(t, p) for t in TOPICS for p in range(3)]
    assert ownership(everything, {**counts, "job.completed": 6}, TOPICS) is None
    assert ownership(everything, {"job.queued": 3}, TOPICS) is None
    assert ownership(everything, counts, TOPICS) == Ownership(3, frozenset({0, 1, 2}))
