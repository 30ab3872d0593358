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
from typing import Any

from pydantic import BaseModel


@dataclass
class OfflineRun:
    members: list[str]                        # the tarball's names
    run: dict[str, Any]                       # the `run` record
    history: dict[int, dict[str, Any]]        # step -> the logged figures (W&B's own `_` keys left out)
    summary: dict[str, Any] = field(default_factory=dict)   # the summary updates, merged in order
    exit_code: int | None = None

    @property
    def config(self) -> dict[str, Any]:
        update = _Update.model_validate(self.run.get("config") or {}).update
        return {k: v for k, v in update.items() if k != "_wandb"}


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
    parsed = OfflineRun(members=members, run={}, history={})
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        rec = _Record.model_validate_json(line)
        if rec.type == "run" and rec.run is not None:
            parsed.run = rec.run
        elif rec.type == "history" and rec.history is not None:
            parsed.history[rec.history.step.num] = {k: v for k, v in rec.history.item.items() if not k.startswith("_")}
        elif rec.type == "summary" and rec.summary is not None:
            parsed.summary.update({k: v for k, v in rec.summary.update.items() if not k.startswith("_")})
        elif rec.type == "exit" and rec.exit is not None:
            parsed.exit_code = rec.exit.exit_code
    return parsed


class _Step(BaseModel):
    num: int


class _History(BaseModel):
    step: _Step
    item: dict[str, Any]


class _Update(BaseModel):
    update: dict[str, Any] = {}


class _Exit(BaseModel):
    exit_code: int = 0


class _Record(BaseModel):
    """One line of `wandb leet inspect --json`: its `type` names the field that carries the record."""

    type: str | None = None
    run: dict[str, Any] | None = None
    history: _History | None = None
    summary: _Update | None = None
    exit: _Exit | None = None
