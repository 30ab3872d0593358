"""TEST-ONLY fault injection, switched on by one environment variable.

    WHETSTONE_RECIPE_FAULTS='{"oom_forwards": 2, "sigterm_after_forward": 7, "poison_line": 12}'

- oom_forwards: the first N training forward passes raise torch.OutOfMemoryError;
- oom_at_forwards: [K, ...]: these training forward passes (counted over the process) raise it;
- sigterm_after_forward: the process sends itself SIGTERM right after training forward
  pass K (counted over the whole process) - lands between gradient-accumulation micro-steps
  when K is not a multiple of the accumulation;
- hang_after_forward: right after training forward pass K the process stops answering (sleeps for
  good, a rank hung before its next collective): its gang's other ranks must time out;
- forward_delay_s: every training forward pass sleeps this long first (a slow node: keeps a run
  going long enough for a test to act on it mid-run);
- poison_line: the example from that source line gets an out-of-vocabulary token id when it
  is collated, so the model fails on it mid-run (a "bad example met mid-run").

Unset (production), `Faults.from_env()` is inert: no hook is installed.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import field

from pydantic import ConfigDict, TypeAdapter
from pydantic.dataclasses import dataclass

ENV = "WHETSTONE_RECIPE_FAULTS"
log = logging.getLogger("whetstone.trainer_agent.recipes")


@dataclass(config=ConfigDict(extra="forbid"))
class Faults:
    oom_forwards: int = 0
    oom_at_forwards: list[int] = field(default_factory=list)
    sigterm_after_forward: int | None = None
    hang_after_forward: int | None = None
    forward_delay_s: float = 0.0
    poison_line: int | None = None
    forwards: int = field(default=0, init=False)

    @classmethod
    def from_env(cls) -> Faults:
        raw = os.environ.get(ENV)
        if not raw:
            return cls()
        faults = TypeAdapter(cls).validate_json(raw)   # an unknown fault is an error (extra="forbid")
        log.warning("TEST fault injection active: %s", faults)
        return faults

    def to_env(self) -> str:
        """The value of ENV that makes a child process inject these faults (`from_env` reads it)."""
        return TypeAdapter(Faults).dump_json(self, exclude={"forwards"}).decode()

    @property
    def active(self) -> bool:
        return bool(self.oom_forwards or self.oom_at_forwards or self.sigterm_after_forward or self.poison_line
                    or self.hang_after_forward or self.forward_delay_s)

    def install(self, model) -> None:
        """Forward hooks on the model being trained (counted only in training mode)."""
        if (self.oom_forwards or self.oom_at_forwards or self.sigterm_after_forward or self.hang_after_forward
                or self.forward_delay_s):
            model.register_forward_pre_hook(self._before_forward)
            model.register_forward_hook(self._after_forward)

    def _before_forward(self, module, args) -> None:  # noqa: ARG002
        if not module.training:
            return
        self.forwards += 1
        if self.forward_delay_s:
            time.sleep(self.forward_delay_s)
        if self.forwards <= self.oom_forwards or self.forwards in self.oom_at_forwards:
            import torch

            raise torch.OutOfMemoryError(f"injected out of memory (test fault, forward {self.forwards})")

    def _after_forward(self, module, args, output) -> None:  # noqa: ARG002
        if module.training and self.forwards == self.sigterm_after_forward:
            os.kill(os.getpid(), signal.SIGTERM)
        if module.training and self.forwards == self.hang_after_forward:
            log.warning("TEST fault: rank hangs after forward %d", self.forwards)
            while True:
                time.sleep(3600)

    def poison(self, vocab_size: int):
        """A collator hook replacing one example's first token by an id the model does not have."""
        if self.poison_line is None:
            return None
        line = self.poison_line

        def apply(input_ids: list[int], example_line: int) -> list[int]:
            ids = list(input_ids)
            if example_line == line:
                ids[0] = vocab_size + 7
            return ids

        return apply
