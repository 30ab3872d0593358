"""Drive a training recipe the way the trainer agent does, for tests and benchmarks.

- `run_subprocess`: a real child process (`python -m whetstone.trainer_agent.recipes.main`), its
  stdout parsed into typed events (`trainer_agent/domain/recipe_io.py`: a line that is not an event
  fails the run); optionally SIGTERM after a given progress step, or test faults via the env var.
- `run_in_process`: the same `execute()` in this process (no interpreter start-up: cheap),
  events captured in memory. SIGTERM is routed to the run's flag while it lasts.

A config is the recipe's own `TrainingConfig` (domain/recipe_io.py), written as the agent writes
it; or the path of a config file the caller wrote itself (tests write broken ones on purpose).
Faults are the recipe's own `Faults` (recipes/faults.py), passed through its environment variable.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    ChildEvent,
    Completed,
    Preempted,
    Progress,
    TrainingConfig,
)
from whetstone.trainer_agent.recipes.faults import ENV as FAULTS_ENV
from whetstone.trainer_agent.recipes.faults import Faults

RECIPE_MODULE = "whetstone.trainer_agent.recipes.main"


E = TypeVar("E")
_EVENT: TypeAdapter[ChildEvent] = TypeAdapter(ChildEvent)


def parse_line(line: str) -> ChildEvent:
    """Strict: stdout must carry nothing but the protocol's events."""
    return _EVENT.validate_json(line)


@dataclass
class RecipeRun:
    returncode: int
    events: list[ChildEvent] = field(default_factory=list)
    stderr: str = ""
    sigterm_sent_at: float | None = None  # time.time()

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    def names(self) -> list[str]:
        return [e.event for e in self.events]

    def losses(self) -> dict[int, float | None]:
        return {e.step: e.loss for e in self.of(Progress)}

    @property
    def last(self) -> ChildEvent | None:
        return self.events[-1] if self.events else None

    @property
    def completed(self) -> Completed:
        """The run's `completed` event (AssertionError naming the last event when there is none)."""
        assert isinstance(self.last, Completed), self.last
        return self.last


ConfigSource = TrainingConfig | Path   # a Path: a config file the caller wrote


def write_config(config: TrainingConfig, workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{config.job_id}.config.json"
    path.write_text(config.model_dump_json(exclude_none=True))
    return path


def _config_file(config: ConfigSource, workdir: Path) -> tuple[Path, str]:
    """(the config file, the name of the run's own files)"""
    if isinstance(config, Path):
        return config, config.name.removesuffix(".json")
    return write_config(config, workdir), config.job_id


def run_subprocess(config: ConfigSource, workdir: Path, *, faults: Faults | None = None,
                   sigterm_after_step: int | None = None, on_event: Callable[[ChildEvent], None] | None = None,
                   timeout_s: float = 300) -> RecipeRun:
    config_path, name = _config_file(config, workdir)
    stderr_path = workdir / f"{name}.stderr.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop(FAULTS_ENV, None)
    if faults:
        env[FAULTS_ENV] = faults.to_env()
    sent_at = None
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", RECIPE_MODULE, "--config", str(config_path)],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        events = []
        try:
            for line in proc.stdout:
                event = parse_line(line)
                events.append(event)
                if on_event is not None:
                    on_event(event)
                if (sigterm_after_step is not None and sent_at is None and isinstance(event, Progress)
                        and event.step >= sigterm_after_step):
                    sent_at = time.time()
                    proc.send_signal(signal.SIGTERM)
            returncode = proc.wait()
        finally:
            watchdog.cancel()
    return RecipeRun(returncode, events, stderr_path.read_text(), sent_at)


def run_in_process(config: ConfigSource, workdir: Path, *, faults: Faults | None = None) -> RecipeRun:
    from whetstone.trainer_agent.recipes.main import execute
    from whetstone.trainer_agent.recipes.protocol import EventStream, PreemptionFlag

    config_path, _ = _config_file(config, workdir)
    buffer = io.StringIO()
    flag = PreemptionFlag()
    previous_handler = signal.signal(signal.SIGTERM, flag._on_sigterm)
    previous_faults = os.environ.pop(FAULTS_ENV, None)
    if faults:
        os.environ[FAULTS_ENV] = faults.to_env()
    try:
        returncode = execute(config_path, EventStream(buffer), flag)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        os.environ.pop(FAULTS_ENV, None)
        if previous_faults is not None:
            os.environ[FAULTS_ENV] = previous_faults
    events = [parse_line(line) for line in buffer.getvalue().splitlines()]
    return RecipeRun(returncode, events)


# ------------------------------------------------------------------ data for the other methods


class Turn(BaseModel):
    """A text chat message, as the demo chat rows hold them."""

    role: str
    content: str


class Conversation(BaseModel):
    """A demo chat row (its other fields are not read here)."""

    messages: list[Turn]


class PreferencePair(BaseModel):
    """A preference row as the dpo/orpo recipes read it: the prompt's turns and two answers."""

    prompt: list[Turn]
    chosen: str
    rejected: str


class TextDocument(BaseModel):
    """A raw-text row for continued pre-training."""

    text: str


def preference_rows(chats: list[Conversation]) -> list[PreferencePair]:
    """Preference pairs from chat rows: chosen = the row's own last answer, rejected = the
    last answer of the next row (a fluent but wrong reply)."""
    pairs = []
    for i, chat in enumerate(chats):
        other = chats[(i + 1) % len(chats)]
        chosen, rejected = chat.messages[-1].content, other.messages[-1].content
        if chosen == rejected:
            rejected = "I do not know."
        pairs.append(PreferencePair(prompt=chat.messages[:-1], chosen=chosen, rejected=rejected))
    return pairs


def text_rows(chats: list[Conversation]) -> list[TextDocument]:
    """Raw documents for continued pre-training: the conversation contents as prose."""
    return [TextDocument(text=" ".join(m.content for m in chat.messages)) for chat in chats]


def write_jsonl(rows: Iterable[BaseModel | dict[str, Any]], path: Path) -> Path:
    """One JSON line per row: a model as its JSON, a dict (tests' hand-made rows) as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r.model_dump_json() if isinstance(r, BaseModel) else json.dumps(r)) + "\n"
                            for r in rows))
    return path


# ------------------------------------------------------------------ resume exactness


@dataclass
class Chain:
    """An uninterrupted run vs the same job interrupted by SIGTERM at given forward passes."""

    reference: RecipeRun
    segments: list[RecipeRun]
    expected_steps: list[int]  # where each emergency checkpoint must be: the step in flight, finished

    @property
    def emergency_steps(self) -> list[int]:
        return [s.of(Checkpoint)[-1].step for s in self.segments[:-1] if s.names()[-1:] == ["preempted"]]

    def chained_losses(self) -> dict[int, float | None]:
        losses: dict[int, float | None] = {}
        for segment in self.segments:
            losses.update(segment.losses())
        return losses

    def final_dirs(self) -> tuple[Path, Path]:
        return self.reference.of(Checkpoint)[-1].path, self.segments[-1].of(Checkpoint)[-1].path

    def exact(self) -> bool:
        """Same per-step losses and the same final weights, bit for bit."""
        if self.emergency_steps != self.expected_steps or not isinstance(self.segments[-1].last, Completed):
            return False
        if self.chained_losses() != self.reference.losses():
            return False
        return same_weights(*self.final_dirs())


def same_weights(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    name = "adapter_model.safetensors" if (a / "adapter_model.safetensors").is_file() else "model.safetensors"
    left, right = load_file(a / name), load_file(b / name)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def interrupted_chain(config: TrainingConfig, workdir: Path, forward_points: list[int], accumulation: int,
                      reference: RecipeRun | None = None) -> Chain:
    """Run `config` uninterrupted (unless given), then as a chain of segments, each sent SIGTERM
    after the given (absolute, 1-based) training forward pass and resumed from its emergency
    checkpoint. The emergency checkpoint must land on the step in flight: ceil(forward / accumulation)."""
    if reference is None:
        reference = run_subprocess(config.model_copy(update={"job_id": f"{config.job_id}-ref",
                                                             "output_dir": workdir / "ref"}), workdir)
    segments: list[RecipeRun] = []
    resume: Path | None = None
    done_forwards, expected = 0, []
    for i, forward in enumerate([*sorted(forward_points), None]):
        segment_config = config.model_copy(update={"job_id": f"{config.job_id}-seg{i}",
                                                   "output_dir": workdir / f"seg{i}", "resume_from": resume})
        faults = Faults(sigterm_after_forward=forward - done_forwards) if forward is not None else None
        run = run_subprocess(segment_config, workdir, faults=faults)
        segments.append(run)
        if forward is None or run.names()[-1:] != ["preempted"]:
            break
        step = -(-forward // accumulation)
        expected.append(step)
        assert isinstance(run.last, Preempted) and run.last.checkpoint is not None, run.last
        resume = run.last.checkpoint
        done_forwards = step * accumulation
    return Chain(reference, segments, expected)
