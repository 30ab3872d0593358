"""Reinforcement fine-tuning recipe, read top to bottom: setup -> train -> save_checkpoint -> cleanup.

    reinforcement   trl GRPOTrainer on a LoRA adapter; the reward is the job's grader (QLoRA: the
                    base loaded in 4-bit NF4 when the job's `base_quantization` is "nf4"; bitsandbytes
                    runs it on CPU nodes too, so no pool is refused it)

The job's `reinforcement` object (resolved by the scheduler, `whetstone.graders.rft`) gives the
grader and the knobs: `batch_size` prompts per optimiser step, `generations` completions sampled
per prompt (one prompt's completions form a micro-batch, so a step accumulates `batch_size`
micro-batches and trl generates all of a step's completions at once), `max_completion_tokens`,
`learning_rate`, `n_epochs`, and `eval_samples` completions per validation prompt.

Data: each row is a prompt (`messages` ending with a user turn) and whatever fields the grader reads
(`{{item.x}}`); the RFT data gate refuses the file before any model is loaded, naming the lines.

Progress events carry trl's `reward` (mean) and `reward_std`, the step's `sub_reward/<name>` of a
multi grader and `grader_errors`; every `eval_interval` steps and at each checkpoint the validation
prompts are graded (`eval_samples` completions each: one greedy, or that many sampled) and the mean
reward rides on that step's progress event and on the checkpoint. The validation prompts are the
job's validation file, or the training file's held-out split when none was given (ingest's hash split). GRPO's loss is not a quality figure, so the divergence guard only
stops on a NaN/Inf loss here.

Resume: HF Trainer checkpoints (adapter, optimiser, scheduler, `rng_state.pth`). trl's sampler
orders prompts from the job's seed and the Trainer skips the batches a resumed epoch already
consumed, so no prompt is repeated or skipped; the torch/numpy/python RNG states saved with the
checkpoint are restored, so the completions sampled after a resume are drawn from the same state
as in an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from whetstone.graders import GraderEnvironment, GraderSettings, parse_grader

from ..domain.recipe_io import Outcome, Validation
from .errors import PlatformError
from .faults import Faults
from .hyperparams import Hyperparameters
from .modeling import lora_config
from .protocol import EventStream, PreemptionFlag
from .rewards import (
    GraderReward,
    PromptRow,
    check_rft_rows,
    mean_reward,
    prompt_rows,
    sub_rewards_callback,
)
from .session import TrainingSession
from .spec import RecipeConfig
from .trainers import TimedSaveMixin, training_arguments

METHODS = ("reinforcement",)


class GRPORecipe:
    """setup -> train -> save_checkpoint -> cleanup, for reinforcement."""

    def __init__(self, cfg: RecipeConfig, events: EventStream, preemption: PreemptionFlag,
                 faults: Faults | None = None) -> None:
        if not cfg.reinforcement:
            raise PlatformError("method reinforcement needs the job's `reinforcement` object in the recipe config",
                                code="bad_recipe_config")
        self.plan = cfg.reinforcement
        self.session = TrainingSession(cfg, events, preemption, faults, packing=False,
                                       load_as="qlora" if self.plan.base_quantization == "nf4" else None)
        self.grader = parse_grader(self.plan.grader)
        self.reward = GraderReward(self.grader, GraderEnvironment(GraderSettings()), reward_sign=self.plan.reward_sign)
        self.prompts: list[PromptRow] = []
        self.validation_prompts: list[PromptRow] = []

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Cheap checks first (the RFT data gate names the lines), then tokenizer, model, trainer."""
        session, cfg = self.session, self.session.cfg
        train_rows, validation_rows = session.read_inputs()
        check_rft_rows(train_rows, self.grader, cfg.train_file.name)
        self.prompts = prompt_rows(train_rows, cfg.train_file.name)
        if validation_rows:
            check_rft_rows(validation_rows, self.grader, cfg.validation_file.name)
            self.validation_prompts = prompt_rows(validation_rows, cfg.validation_file.name)
        model = session.load_model([])
        session.hp = self.geometry(session.hp)
        self._build_trainer(model)

    def geometry(self, hp: Hyperparameters) -> Hyperparameters:
        """A micro-batch is one prompt's completions; a step accumulates `batch_size` prompts."""
        plan = self.plan
        return replace(hp, batch_size=plan.generations, gradient_accumulation_steps=plan.batch_size,
                       learning_rate=plan.learning_rate, n_epochs=plan.n_epochs, packing=False, divergence_factor=0.0)

    def rebuild(self, hp: Hyperparameters) -> None:
        """After an out-of-memory error: a fresh model and trainer. The geometry stays (one prompt's
        completions per micro-batch is the smallest GRPO can group)."""
        self._build_trainer(self.session.reload_model(self.geometry(hp)))

    def _build_trainer(self, model) -> None:
        from datasets import Dataset
        from transformers import set_seed
        from trl import GRPOConfig, GRPOTrainer

        session, cfg, hp = self.session, self.session.cfg, self.session.hp
        set_seed(hp.seed)  # LoRA init
        model.config.use_cache = True   # generation needs the KV cache; nothing is packed here
        # GRPO's inputs have no input_ids for the Trainer to count
        args = training_arguments(hp, output_dir=cfg.output_dir, deepspeed=cfg.deepspeed, count_input_tokens=False)
        config = GRPOConfig(
            **args, num_generations=self.plan.generations, max_completion_length=self.plan.max_completion_tokens,
            # pinned: trl's GRPO defaults move between versions
            beta=0.0, loss_type="dapo", scale_rewards="group", num_iterations=1, epsilon=0.2, temperature=1.0,
            top_p=1.0, top_k=0, shuffle_dataset=True, remove_unused_columns=False, log_completions=False,
            mask_truncated_completions=False)
        trainer_class = type("PlatformGRPOTrainer", (TimedSaveMixin, GRPOTrainer), {})
        callbacks = [sub_rewards_callback(self.reward),
                     *session.callbacks(self._validate if self.validation_prompts else None,
                                        # trl repeats each prompt once per completion
                                        examples_per_epoch=len(self.prompts) * self.plan.generations,
                                        validate_every=self.plan.eval_interval)]
        trainer = trainer_class(model=model, reward_funcs=[self.reward], args=config,
                                train_dataset=Dataset.from_list([p.record() for p in self.prompts]), processing_class=session.tokenizer,
                                peft_config=lora_config(model, hp), callbacks=callbacks)
        session.install(trainer)

    def _validate(self, model: Any) -> Validation:
        return mean_reward(model, self.session.tokenizer, self.validation_prompts, self.reward,
                           max_new_tokens=self.plan.max_completion_tokens, samples=self.plan.eval_samples,
                           seed=self.session.hp.seed)

    # ------------------------------------------------------------------ train (session.train)

    def validation(self) -> Validation | None:
        return self._validate(self.session.trainer.model) if self.validation_prompts else None

    def outcome(self) -> Outcome:
        """What this method adds to the `completed` event: the rewards of the run's logged steps."""
        rewards = [p.reward for p in self.session.run.progress if p.reward is not None]
        return Outcome(reward_first=rewards[0] if rewards else None, reward_last=rewards[-1] if rewards else None,
                       generations=self.plan.generations)

    # ------------------------------------------------------------------ save_checkpoint

    def save_checkpoint(self) -> Path:
        """output_dir/final: the adapter, tokenizer, summary, reward/loss curve."""
        return self.session.save_final(merge=self.session.hp.merge_adapter, non_padding_fraction=None)

    # ------------------------------------------------------------------ cleanup (session.cleanup)
