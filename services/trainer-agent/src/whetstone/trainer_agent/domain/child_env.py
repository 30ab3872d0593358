"""The environment a training (or merge) child inherits from the agent: an allow-list. Pure.

The agent holds the platform's credentials (the database DSN, the Kafka password, S3 keys, the
internal secret); the child needs none of them. It reads its config file and the local copies the
agent staged, prints JSON-lines events and writes checkpoints into its scratch directory, which the
agent uploads: the child never talks to S3, Postgres or Kafka, so it gets no credential for any of
them. What passes is what a Python process, torch and its launchers need (paths, locale, threads,
CUDA/NCCL/gloo, Hugging Face offline settings) plus the two variables the recipe itself reads
(test fault injection, the commit and image digest it writes into the environment lockfile).
A name that looks like a credential (`*_TOKEN`, `*_SECRET`, `*_PASSWORD`, `*_KEY`, ...) is dropped
even under an allowed prefix (HF_TOKEN: the child loads only the staged base, never the Hub).

A reinforcement child grades its own samples: it gets the graders' settings (`WHETSTONE_GRADERS_*`)
and the one kind of key it may hold, a judge or embeddings endpoint's key, under the variable that
endpoint's `api_key_env` names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "PWD", "LANG", "LANGUAGE", "TZ",
    "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "WHETSTONE_RECIPE_FAULTS",                            # recipes/faults.py (tests only; inert when unset)
    "WHETSTONE_GIT_COMMIT", "WHETSTONE_IMAGE_DIGEST", "IMAGE_DIGEST",   # runtime/environment.py's lockfile
})
ALLOWED_PREFIXES = ("LC_", "HF_", "TRANSFORMERS_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "CUDA_", "CUBLAS_",
                    "CUDNN_", "NCCL_", "GLOO_", "NVIDIA_", "TRITON_", "DS_", "ACCELERATE_", "COV_CORE_",
                    "WHETSTONE_GRADERS_")
GRADER_ENDPOINTS = ("WHETSTONE_GRADERS_JUDGES", "WHETSTONE_GRADERS_EMBEDDINGS")
CREDENTIAL = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?|DSN|AUTH)$")


def allowed(name: str) -> bool:
    if CREDENTIAL.search(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def _key_names(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        name = value.get("api_key_env")
        if isinstance(name, str):
            yield name
        for inner in value.values():
            yield from _key_names(inner)


def grader_key_names(inherited: Mapping[str, str]) -> set[str]:
    """The variables the graders' endpoints read their keys from (`api_key_env`)."""
    names: set[str] = set()
    for setting in GRADER_ENDPOINTS:
        try:
            names |= set(_key_names(json.loads(inherited.get(setting) or "null")))
        except ValueError:
            continue   # malformed: the child's GraderSettings reports it
    return names


def child_environment(inherited: Mapping[str, str]) -> dict[str, str]:
    """The part of the agent's environment a child may see."""
    keys = grader_key_names(inherited)
    return {k: v for k, v in inherited.items() if allowed(k) or k in keys}
