"""Training recipes run by the trainer agent as child processes.

    python -m whetstone.trainer_agent.recipes.main --config CONFIG.json

Recipes (one per method family, each read top to bottom: setup -> train -> save_checkpoint ->
cleanup; they share components, never a base class):
- sft.py            SFTRecipe: lora, qlora, full (chat SFT on assistant tokens), cpt (raw text)
- preference.py     PreferenceRecipe: dpo (stored reference log-probs), orpo
- grpo.py           GRPORecipe: reinforcement (trl GRPOTrainer + LoRA, the job's grader as reward)
- vision.py         VisionSFTRecipe: lora, qlora on image+text chats (vision-language base, vision tower frozen)

Entry point and protocol:
- main.py           picks the recipe by method; SIGTERM flag, stdout events, OOM retries, exit status
- protocol.py       the event stream (stdout) and the preemption flag (SIGTERM)
- spec.py           CONFIG.json read once (domain/recipe_io.TrainingConfig), resume-dir checks

Components:
- session.py        the steps every recipe shares: cheap checks, base model and batch plan, the
                    model rebuilt after OOM, train, the final artifact, cleanup (held, not inherited)
- hyperparams.py    validation, per-method/per-size defaults, batch geometry (auto, OOM halving) (pure)
- data.py           line-numbered readers per format, chat masking, padding-free/padded collators
- attention.py      per-example attention for packed rows
- modeling.py       tokenizer and base model loading (fp32/bf16, 4-bit NF4 for QLoRA), LoRA targets
- trainers.py       shared TrainingArguments; Trainer/DPO/ORPO subclasses: timed checkpoints,
                    bad-example blame, stored ref log-probs
- callbacks.py      the training monitor: progress events, checkpoint cadence, SIGTERM stop, divergence
- checkpointing.py  whetstone_state.json, resume geometry, the final artifact (atomic)
- validation.py     validation loss per data kind
- rewards.py        the grader as a reward function, the RFT data gate, mean reward on held-out prompts
- metrics.py        progress meter, peak memory, GPU utilization, loss curve PNG
- faults.py         fault injection for tests (WHETSTONE_RECIPE_FAULTS; inert when unset)

The CONFIG.json and event models are shared with the agent: ../domain/recipe_io.py. Tests and benches
run a recipe as the agent does with whetstone.devstack.recipe_harness.
"""
