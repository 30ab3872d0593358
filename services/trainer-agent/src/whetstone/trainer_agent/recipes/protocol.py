"""The recipe's side of the protocol with the trainer agent: events on stdout, SIGTERM.

- stdout carries ONLY events, one JSON object per line. Everything else (logs, warnings,
  progress bars, stray prints of libraries) goes to stderr: fd 1 is re-pointed to fd 2
  before anything heavy is imported.
- SIGTERM sets a flag; the training loop polls it after each optimizer step.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import TextIO

from ..domain.recipe_io import ChildEvent

log = logging.getLogger("whetstone.trainer_agent.recipes")


class EventStream:
    """One JSON object per line on the ORIGINAL stdout; fd 1 then points at stderr."""

    def __init__(self, stream: TextIO, job_id: str | None = None) -> None:
        self._stream = stream
        self.job_id = job_id

    @classmethod
    def claim_stdout(cls) -> EventStream:
        sys.stdout.flush()
        events_fd = os.dup(1)
        os.dup2(2, 1)  # every later write to fd 1 (print, tqdm, C code) lands on stderr
        return cls(os.fdopen(events_fd, "w", buffering=1, encoding="utf-8"))

    def emit(self, event: ChildEvent) -> None:
        stamped = event.model_copy(update={"job_id": event.job_id or self.job_id, "time": round(time.time(), 3)})
        try:  # non-finite floats are written as null: every line is strict JSON
            self._stream.write(stamped.model_dump_json(exclude_none=True) + "\n")
            self._stream.flush()
        except BrokenPipeError:  # parent went away; keep training, logs still go to stderr
            log.warning("event stream closed; dropped event %s", event.event)


class PreemptionFlag:
    """Set by SIGTERM; polled by the trainer callback after each optimizer step."""

    def __init__(self) -> None:
        self.requested = False
        self.received_at: float | None = None  # time.time() of the first SIGTERM

    def install(self) -> PreemptionFlag:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if not self.requested:
            self.requested, self.received_at = True, time.time()
            log.warning("SIGTERM received: stopping after the current optimizer step")
