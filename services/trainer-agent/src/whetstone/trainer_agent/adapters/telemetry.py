"""What the node's heartbeat reports about its hardware: per-GPU figures from `nvidia-smi` when it is
on the PATH, and always the node's CPU busy % and the resident memory of the agent and its training
processes. Sampling never fails a heartbeat: a broken `nvidia-smi` is logged once and left out."""

from __future__ import annotations

import asyncio
import os
import shutil

import psutil
from whetstone.contracts import GpuSample
from whetstone.runtime.logging import get_logger

from ..domain.telemetry import NVIDIA_SMI_ARGS, NodeFigures, parse_nvidia_smi

log = get_logger("whetstone.trainer_agent.telemetry")


class NodeTelemetry:
    def __init__(self, nvidia_smi: str | None = None, timeout_s: float = 5.0) -> None:
        self.nvidia_smi = nvidia_smi if nvidia_smi is not None else shutil.which("nvidia-smi")
        self.timeout_s = timeout_s
        self._process = psutil.Process(os.getpid())
        self._failing = False
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    async def sample(self) -> NodeFigures:
        """The heartbeat's hardware figures: gpus (when nvidia-smi answers), cpu_percent, rss_mb."""
        gpus = await self._gpus() if self.nvidia_smi else None
        return NodeFigures(cpu_percent=psutil.cpu_percent(interval=None), rss_mb=self._rss_mb(), gpus=gpus or [])

    def _rss_mb(self) -> float | None:
        try:
            processes = [self._process, *self._process.children(recursive=True)]
            total = 0
            for p in processes:
                try:
                    total += p.memory_info().rss
                except psutil.Error:  # a child that just exited
                    continue
            return round(total / 2**20, 1)
        except psutil.Error:
            return None

    async def _gpus(self) -> list[GpuSample] | None:
        try:
            proc = await asyncio.create_subprocess_exec(self.nvidia_smi, *NVIDIA_SMI_ARGS, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout=self.timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise RuntimeError(f"nvidia-smi did not answer within {self.timeout_s}s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"nvidia-smi exited {proc.returncode}: {err.decode(errors='replace')[:300]}")
            gpus = parse_nvidia_smi(out.decode(errors="replace"))
        except (OSError, RuntimeError, ValueError) as exc:
            if not self._failing:
                log.warning("nvidia-smi unusable; heartbeats carry CPU figures only", error=str(exc))
            self._failing = True
            return None
        if self._failing:
            log.info("nvidia-smi answers again")
        self._failing = False
        return gpus
