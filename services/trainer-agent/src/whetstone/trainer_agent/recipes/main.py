"""Entry point of every training recipe, run by the trainer agent as a child process.

    python -m whetstone.trainer_agent.recipes.main --config CONFIG.json

`method` in CONFIG picks the recipe (setup -> train -> save_checkpoint -> cleanup):
`sft.SFTRecipe` for lora, qlora, full and cpt; `preference.PreferenceRecipe` for dpo and orpo;
`grpo.GRPORecipe` for reinforcement; `vision.VisionSFTRecipe` when the base model sees images or
the training file holds images (lora and qlora; other methods refused there).

Protocol with the parent (the trainer agent):
- stdout carries ONLY events, one JSON object per line: `started`, `progress`,
  `checkpoint` (kind periodic | emergency | final), `completed`, `failed`, `preempted`,
  and `oom_retry`. Everything else goes to stderr (fd 1 is re-pointed to fd 2 first).
- SIGTERM (spot loss, priority preemption): the handler is installed before anything
  heavy is imported; the current optimizer step finishes (all its gradient-accumulation
  micro-steps), an emergency checkpoint is written, then `checkpoint` + `preempted`
  are printed and the process exits 0.
- Out of memory: the micro-batch is halved and the accumulation doubled (same effective
  batch), training goes on from the last checkpoint of this segment (or its start), up
  to `max_oom_retries` times; then `failed` (ambiguous) with advice.
- `failed` carries error_class user | platform | ambiguous, a code, the message and,
  where there is some, advice.
- Exit status: 0 completed or preempted, 1 failed (after a `failed` event).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import Protocol

from whetstone.contracts.enums import ErrorClass, Method
from whetstone.runtime import pdeathsig

from ..domain.recipe_io import (
    Completed,
    Failed,
    OomRetry,
    Outcome,
    Preempted,
    Validation,
)
from .checkpointing import checkpoint_step
from .errors import AmbiguousError, RecipeError, is_out_of_memory
from .hyperparams import PREFERENCE_METHODS, Hyperparameters, halved_batch
from .protocol import EventStream, PreemptionFlag
from .session import TrainingSession
from .spec import RecipeConfig

log = logging.getLogger("whetstone.trainer_agent.recipes.main")


class Recipe(Protocol):
    """What every recipe module offers this entry point; the steps they share (train, train_loss,
    cleanup, the config, hyperparameters and trainer) are its `session`."""

    session: TrainingSession

    def setup(self) -> None: ...
    def rebuild(self, hp: Hyperparameters) -> None: ...
    def save_checkpoint(self) -> Path: ...
    def validation(self) -> Validation | None: ...
    def outcome(self) -> Outcome: ...


def recipe_for(cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag) -> Recipe:
    from .faults import Faults

    if cfg.method == Method.REINFORCEMENT:
        from .grpo import GRPORecipe

        return GRPORecipe(cfg, events, preemption, Faults.from_env())
    from .vision import VisionSFTRecipe, is_vision_job

    if is_vision_job(cfg):  # a base that sees images, or images in the data: lora/qlora only (others refused)
        return VisionSFTRecipe(cfg, events, preemption, Faults.from_env())
    if cfg.method in PREFERENCE_METHODS:
        from .preference import PreferenceRecipe

        return PreferenceRecipe(cfg, events, preemption, Faults.from_env())
    from .sft import SFTRecipe

    return SFTRecipe(cfg, events, preemption, Faults.from_env())


def _configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def run(cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag, started: float) -> int:
    recipe = recipe_for(cfg, events, preemption)
    session = recipe.session
    try:
        recipe.setup()
        if preemption.requested:  # SIGTERM during setup: nothing new to checkpoint
            step = checkpoint_step(cfg.resume_from)
            events.emit(Preempted(step=step, checkpoint=cfg.resume_from))
            return 0
        train_started = time.perf_counter()
        oom_retries = _train_with_oom_retries(recipe, events)
        train_seconds = time.perf_counter() - train_started
        state = session.trainer.state
        if session.run.emergency_checkpoint is not None:
            events.emit(Preempted(step=state.global_step, checkpoint=session.run.emergency_checkpoint,
                                  sigterm_to_checkpoint_s=_since(preemption.received_at)))
            return 0
        recipe.save_checkpoint()
        events.emit(Completed(
            step=state.global_step,
            train_loss=session.train_loss(),
            tokens=state.num_input_tokens_seen,
            runtime_s=round(time.perf_counter() - started, 3),
            train_runtime_s=round(session.train_output.metrics.get("train_runtime", 0.0), 3),
            checkpoint_s=round(session.run.checkpoint_seconds + _trainer_checkpoint_seconds(session), 3),
            training_loop_s=round(train_seconds, 3),
            micro_batch_size=int(session.hp.batch_size),
            gradient_accumulation_steps=session.hp.gradient_accumulation_steps,
            oom_retries=oom_retries,
            outcome=recipe.outcome(),
            validation=recipe.validation(),
        ))
        return 0
    finally:
        session.cleanup()


def _train_with_oom_retries(recipe: Recipe, events: EventStream) -> int:
    """Train; on out-of-memory halve the micro-batch (same effective batch) and go on from
    the last checkpoint this segment wrote (or where it started). Returns the retries used."""
    session = recipe.session
    resume = session.cfg.resume_from
    retries = 0
    while True:
        try:
            session.train(resume)
            return retries
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            hp = session.hp
            smaller = halved_batch(hp)
            if smaller is None or retries >= hp.max_oom_retries:
                raise AmbiguousError(
                    f"out of memory at micro-batch {hp.batch_size} (max_seq_len {hp.max_seq_len}) "
                    f"after {retries} retries with smaller micro-batches: {exc}",
                    code="out_of_memory",
                    advice=["lower max_seq_len", "use method qlora (4-bit base weights)",
                            "enable gradient_checkpointing", "request a GPU with more memory"]) from exc
            retries += 1
            resume = session.run.last_checkpoint or session.cfg.resume_from
            log.warning("out of memory (%s); retry %d with micro-batch %d x accumulation %d from %s",
                        exc, retries, smaller.batch_size, smaller.gradient_accumulation_steps, resume or "the start")
            events.emit(OomRetry(attempt=retries, micro_batch_size=int(smaller.batch_size),
                                 gradient_accumulation_steps=smaller.gradient_accumulation_steps,
                                 resume_step=checkpoint_step(resume), message=str(exc)[:500]))
            recipe.rebuild(smaller)


def _trainer_checkpoint_seconds(session: TrainingSession) -> float:
    return getattr(session.trainer, "checkpoint_seconds", 0.0)


def _since(moment: float | None) -> float | None:
    return round(time.time() - moment, 3) if moment is not None else None


def execute(config_path: Path, events: EventStream, preemption: PreemptionFlag, started: float | None = None) -> int:
    """Load CONFIG and run the recipe; every failure becomes ONE `failed` event. Returns the exit status."""
    started = time.perf_counter() if started is None else started
    try:
        cfg = RecipeConfig.load(config_path)
        events.job_id = cfg.job_id
        return run(cfg, events, preemption, started)
    except RecipeError as exc:
        log.error("%s error: %s", exc.error_class, exc)
        events.emit(exc.event())
    except Exception as exc:  # noqa: BLE001 - anything unexpected is the platform's fault
        if is_out_of_memory(exc):
            events.emit(Failed(error_class=ErrorClass.AMBIGUOUS, code="out_of_memory",
                               message=f"{type(exc).__name__}: {exc}"))
        else:
            log.exception("recipe crashed")
            events.emit(Failed(code="recipe_crashed", message=f"{type(exc).__name__}: {exc}"))
    return 1


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    preemption = PreemptionFlag().install()  # FIRST: before any slow import or model load
    if "TORCHELASTIC_RUN_ID" in os.environ and not pdeathsig.die_with_parent(os.getppid()):
        return 137  # a worker of torchrun (or deepspeed) dies with its launcher, as the launcher with the agent
    events = EventStream.claim_stdout()
    if int(os.environ.get("RANK", "0")) != 0:  # multi-process launch: rank 0 speaks for the job
        events = EventStream(io.StringIO())
    _configure_logging()
    parser = argparse.ArgumentParser(prog="python -m whetstone.trainer_agent.recipes.main")
    parser.add_argument("--config", type=Path, required=True, help="recipe config JSON")
    args = parser.parse_args(argv)
    return execute(args.config, events, preemption, started)


def exit_now(status: int) -> None:
    """End the child without the interpreter's teardown. By now every event is written and flushed
    (`EventStream.emit`), every checkpoint saved and closed; unloading torch, transformers and
    DeepSpeed took another 3-5 s per run, which the agent spent waiting for the exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
