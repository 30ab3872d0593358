"""In-memory copies of open jobs' state, so a batch does not re-read and re-decode
the state of every job it touches.

A copy is used only if its version equals the one just read under the row lock (see
LedgerStore). A copy is taken out of the cache before it is changed and put back
with the version the transaction wrote: if the transaction fails, the copy is either
gone or carries a version the database never committed, so it is never reused."""

from __future__ import annotations

from collections import OrderedDict

from ..domain.ledger import JobState, SegmentState

State = tuple[JobState, list[SegmentState]]


class StateCache:
    def __init__(self, max_jobs: int = 50_000) -> None:
        self.max_jobs = max_jobs
        self._entries: OrderedDict[str, tuple[int, State]] = OrderedDict()
        self.hits = self.misses = 0

    def take(self, job_id: str, version: int) -> State | None:
        entry = self._entries.pop(job_id, None)
        if entry is not None and entry[0] == version:
            self.hits += 1
            return entry[1]
        self.misses += 1
        return None

    def put(self, job_id: str, version: int, state: State) -> None:
        self._entries[job_id] = (version, state)  # the most recently used last
        while len(self._entries) > self.max_jobs:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
