"""Reading back a W&B offline-run result file in tests, with the SDK's own reader.

The tarball is unpacked and its `.wandb` transaction log read by `wandb leet inspect --json` (one JSON
record per line, the way `wandb sync` replays it): the run record (project, entity, name, tags, config),
the history rows by step, and the exit record."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, JsonValue


class _Update(BaseModel):
    update: dict[str, JsonValue] = {}


class RunConfig(BaseModel):
    """The run's config as the platform writes it (ingest's `WandbPlan.config`)."""

    job_id: str
    base_model: str
    base_model_sha256: str
    method: str
    dataset_id: str
    suffix: str | None = None
    hyperparameters: dict[str, JsonValue] = {}


class RunRecord(BaseModel):
    """The `run` record: where the run goes, its name and tags, and its config update."""

    project: str | None = None
    entity: str | None = None
    display_name: str | None = None
    tags: list[str] = []
    config: _Update = _Update()


@dataclass
class OfflineRun:
    members: list[str]                                              # the tarball's names
    run: RunRecord = field(default_factory=RunRecord)
    history: dict[int, dict[str, float]] = field(default_factory=dict)   # step -> the logged figures (W&B's own `_` keys left out)
    summary: dict[str, float] = field(default_factory=dict)        # the summary updates, merged in order
    exit_code: int | None = None

    @property
    def config(self) -> RunConfig:
        return RunConfig.model_validate({k: v for k, v in self.run.config.update.items() if k != "_wandb"})


def _figures(values: dict[str, JsonValue]) -> dict[str, float]:
    """A record's figures (W&B's own `_` keys left out): every one a number."""
    return {k: float(v) for k, v in values.items() if not k.startswith("_") and isinstance(v, int | float)}


def read_offline_run(body: bytes, timeout_s: float = 60.0) -> OfflineRun:
    with tempfile.TemporaryDirectory(prefix="wandb-read-") as tmp, \
            tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        members = tar.getnames()
        tar.extractall(tmp, filter="data")
        [log] = list(Path(tmp).glob("offline-run-*/*.wandb"))
        wandb_cli = Path(sys.executable).with_name("wandb")
        out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(log)], capture_output=True,
                             text=True, timeout=timeout_s, check=True, cwd=tmp,
                             env={"PATH": "/usr/bin:/bin", "HOME": tmp, "WANDB_MODE": "offline",
                                  "WANDB_SILENT": "true"})
    parsed = OfflineRun(members=members)
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        rec = _Record.model_validate_json(line)
        if rec.type == "run" and rec.run is not None:
            parsed.run = rec.run
        elif rec.type == "history" and rec.history is not None:
            parsed.history[rec.history.step.num] = _figures(rec.history.item)
        elif rec.type == "summary" and rec.summary is not None:
            parsed.summary.update(_figures(rec.summary.update))
        elif rec.type == "exit" and rec.exit is not None:
            parsed.exit_code = rec.exit.exit_code
    return parsed


class _Step(BaseModel):
    num: int


class _History(BaseModel):
    step: _Step
    item: dict[str, JsonValue]


class _Exit(BaseModel):
    exit_code: int = 0


class _Record(BaseModel):
    """One line of `wandb leet inspect --json`: its `type` names the field that carries the record."""

    type: str | None = None
    run: RunRecord | None = None
    history: _History | None = None
    summary: _Update | None = None
    exit: _Exit | None = None
