"""Training recipes run by the trainer agent as child processes.

    python -m whetstone.trainer_agent.recipes.sft --config CONFIG.json

- sft.py          entry point: SIGTERM flag, stdout events, OOM retries, exit status
- recipe.py       TrainingRecipe for every method: setup -> train -> save_checkpoint -> cleanup
- spec.py         CONFIG.json (the contract with the agent), resume-dir checks
- hyperparams.py  validation, per-method/per-size defaults, batch size "auto" (pure)
- data.py         line-numbered readers per format, chat masking, padding-free/padded collators
- attention.py    per-example attention for packed rows
- modeling.py     base model loading (fp32/bf16, 4-bit NF4 for QLoRA), LoRA targets
- trainers.py     Trainer/DPO/ORPO subclasses: timed checkpoints, bad-example blame, stored ref log-probs
- callbacks.py    progress events, checkpoint cadence, SIGTERM stop, divergence guard
- metrics.py      peak memory, GPU utilization, loss curve PNG
- faults.py       test-only fault injection (WHETSTONE_RECIPE_FAULTS)
- harness.py      run a recipe as the agent does (tests, benchmarks), resume-exactness chains
"""
