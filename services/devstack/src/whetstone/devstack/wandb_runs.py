"""Reading back a W&B offline-run result file in tests, with the SDK's own reader.

The tarball is unpacked and its `.wandb` transaction log read by `wandb leet inspect --json` (one JSON
record per line, the way `wandb sync` replays it): the run record (project, entity, name, tags, config),
the history rows by step, and the exit record."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class OfflineRun:
    members: list[str]                        # the tarball's names
    run: dict[str, Any]                       # the `run` record
    history: dict[int, dict[str, Any]]        # step -> the logged figures (W&B's own `_` keys left out)
    summary: dict[str, Any] = field(default_factory=dict)   # the summary updates, merged in order
    exit_code: int | None = None

    @property
    def config(self) -> dict[str, Any]:
        return {k: v for k, v in self.run.get("config", {}).get("update", {}).items() if k != "_wandb"}


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
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    parsed = OfflineRun(members=members, run={}, history={})
    for rec in records:
        kind = rec.get("type")
        if kind == "run":
            parsed.run = rec["run"]
        elif kind == "history":
            step = int(rec["history"]["step"]["num"])
            parsed.history[step] = {k: v for k, v in rec["history"]["item"].items() if not k.startswith("_")}
        elif kind == "summary":
            parsed.summary.update({k: v for k, v in rec["summary"].get("update", {}).items()
                                   if not k.startswith("_")})
        elif kind == "exit":
            parsed.exit_code = int(rec["exit"].get("exit_code", 0))
    return parsed
