"""W&B offline runs written with the `wandb` SDK, in a child process of their own.

`write_offline_run` starts `python -m whetstone.ingest.adapters.wandb_offline` with the run's input on
stdin and an environment of its own: WANDB_MODE=offline (the SDK writes the run's `.wandb` log to disk and
never contacts a server), WANDB_SILENT, and WANDB_DIR / its config and cache dirs in a fresh temporary
directory, nothing of the service's environment beyond PATH (no proxy, no W&B key). The child is killed
past `timeout_s`. Its `offline-run-*` directory (the `.wandb` log and `files/`; the SDK's debug logs are
left out) is packed into a `.tar.gz` that `wandb sync offline-run-*` uploads later.

A process of its own keeps the SDK's global state (its `wandb-core` service, `wandb.run`, atexit hooks)
out of the service and lets a stuck SDK be killed."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from ..domain.wandb_runs import WandbRunInput

CHILD_MODULE = "whetstone.ingest.adapters.wandb_offline"
PACKED = ("files",)   # the run directory's subdirectories packed beside its `.wandb` log


class WandbRunError(RuntimeError):
    """The SDK process failed or ran past its time; the message carries the end of its stderr."""


async def write_offline_run(run: WandbRunInput, timeout_s: float) -> bytes:
    """The run, written by the SDK offline, as `.tar.gz` bytes holding one `offline-run-*` directory."""
    with tempfile.TemporaryDirectory(prefix="whetstone-wandb-") as tmp:
        root = Path(tmp)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LANG": "C.UTF-8",
               "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(root),
               "WANDB_CONFIG_DIR": str(root / "config"), "WANDB_CACHE_DIR": str(root / "cache"),
               "WANDB_DATA_DIR": str(root / "data"), "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
               "WANDB_ERROR_REPORTING": "false", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", CHILD_MODULE, cwd=tmp, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(run.model_dump_json().encode()), timeout_s)
        except BaseException:   # past the timeout, or the worker cancelled: the SDK goes too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):   # the SDK's wandb-core, should it outlive the child
                os.killpg(proc.pid, 9)
        if proc.returncode != 0:
            raise WandbRunError(f"the wandb SDK exited with {proc.returncode}: "
                                f"{err.decode(errors='replace')[-800:].strip()}")
        run_dir = root / "wandb" / out.decode().strip()
        if not run_dir.name.startswith("offline-run-") or not list(run_dir.glob("*.wandb")):
            raise WandbRunError(f"the wandb SDK wrote no offline run (said {out.decode(errors='replace')[-200:]!r})")
        return await asyncio.to_thread(pack, run_dir)


def pack(run_dir: Path) -> bytes:
    """`offline-run-*/run-<id>.wandb` and `offline-run-*/files/...`, gzipped."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for log in sorted(run_dir.glob("*.wandb")):
            tar.add(log, arcname=f"{run_dir.name}/{log.name}")
        for sub in PACKED:
            if (run_dir / sub).is_dir():
                tar.add(run_dir / sub, arcname=f"{run_dir.name}/{sub}")
    return buf.getvalue()


def _child() -> None:
    """In the child: write the run from stdin's input, print its directory's name."""
    run = WandbRunInput.model_validate_json(sys.stdin.buffer.read())
    import wandb   # only here: the service process never loads the SDK

    settings = wandb.Settings(mode="offline", silent=True, console="off", save_code=False, disable_git=True,
                              disable_code=True, x_disable_stats=True, x_disable_meta=True,
                              x_disable_machine_info=True, x_save_requirements=False, host="whetstone")
    handle = wandb.init(project=run.project, entity=run.entity, name=run.name, id=run.run_id, tags=run.tags,
                        config=run.config, dir=os.environ["WANDB_DIR"], settings=settings)
    for step, values in run.history:
        handle.log(values, step=step)
    handle.summary.update(run.summary)
    run_dir = Path(handle.dir).parent      # handle.dir is `<run dir>/files`
    handle.finish()
    wandb.teardown()
    print(run_dir.name)


if __name__ == "__main__":
    _child()
