"""Run the SFT recipe as the trainer agent does: a child process, JSON events on stdout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

RECIPE_MODULE = "whetstone.trainer_agent.recipes.sft"


@dataclass
class RecipeRun:
    returncode: int
    events: list[dict] = field(default_factory=list)
    stderr: str = ""

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def names(self) -> list[str]:
        return [e["event"] for e in self.events]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("progress")}


def read_rows(path: Path) -> list[list[dict]]:
    """The `messages` of every row of a chat JSONL file."""
    return [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]


def run_recipe(config: dict, workdir: Path, *, sigterm_after_step: int | None = None,
               timeout_s: float = 120) -> RecipeRun:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{config['job_id']}.config.json"
    config_path.write_text(json.dumps(config))
    stderr_path = workdir / f"{config['job_id']}.stderr.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", RECIPE_MODULE, "--config", str(config_path)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        events, signalled = [], False
        try:
            for line in proc.stdout:
                events.append(json.loads(line))  # stdout must carry nothing but JSON events
                event = events[-1]
                if (sigterm_after_step is not None and not signalled and event["event"] == "progress"
                        and event["step"] >= sigterm_after_step):
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
            returncode = proc.wait()
        finally:
            watchdog.cancel()
    return RecipeRun(returncode=returncode, events=events, stderr=stderr_path.read_text())
