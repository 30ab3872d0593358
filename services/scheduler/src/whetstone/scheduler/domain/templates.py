"""Job templates, pure: what a template may hold, how a reference names one (`name` or `name@3`),
and how a job create's own fields lay over a template's (the overrides are recorded)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from whetstone.contracts.events import IMAGE_PIN

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# what a template may set: the job create's fields that describe *how* to train, not *what* on
FIELDS = ("model", "method", "hyperparameters", "resources", "eval_config", "suffix", "seed", "tier", "image",
          "integrations")
SPEC_FIELDS = ("training_file", "validation_file", "metadata", "idempotency_key")


DIGEST = re.compile(IMAGE_PIN)


def image_problem(image: str) -> str | None:
    """Why `image` cannot pin a trainer image (None: it can). Only a digest pins: a tag (`:latest`,
    `:v3`) can be moved to other bytes after the template is written, so it is refused rather than
    resolved (no container registry is asked at template creation)."""
    if DIGEST.fullmatch(image):
        return None
    name, at, digest = image.partition("@")
    if at and digest.startswith("sha256:"):
        return f"{image!r}: the digest after '@sha256:' must be 64 lowercase hex characters"
    tag = f" (':{name.rsplit(':', 1)[1]}' is a tag, which can move)" if ":" in name.rsplit("/", 1)[-1] else ""
    return (f"{image!r} is not pinned by digest{tag}: give the trainer image as name@sha256:<64 hex>, "
            "e.g. the digest `docker buildx imagetools inspect` or the registry reports")


class TemplateError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


@dataclass(frozen=True)
class TemplateRef:
    name: str
    version: int | None   # None: the latest


def parse_ref(ref: str) -> TemplateRef:
    name, at, version = ref.partition("@")
    if not NAME.fullmatch(name):
        raise TemplateError("template", f"{ref!r} is not a template name (letters, digits, . _ -; up to 64)")
    if not at:
        return TemplateRef(name, None)
    if not version.isdigit() or int(version) < 1:
        raise TemplateError("template", f"{ref!r}: the version after '@' must be a number >= 1")
    return TemplateRef(name, int(version))


@dataclass(frozen=True)
class TemplateBody:
    """A POSTed template: its name, description and the job create's fields it sets, as written."""

    name: str
    description: str
    fields: dict[str, Any]


class StoredTemplate(BaseModel):
    """One kept version of a tenant's template, as the templates API shows it."""

    model_config = ConfigDict(frozen=True)

    object: str = "job_template"
    id: str            # name@version
    name: str
    version: int
    description: str
    created_at: int
    template: dict[str, Any]   # the job fields as the tenant wrote them


def split_body(body: Any) -> TemplateBody:
    """A POSTed template -> its name, description and job fields. Unknown fields are refused by name."""
    if not isinstance(body, dict):
        raise TemplateError("body", "a template is a mapping (YAML or JSON object)")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise TemplateError("name", "required: letters, digits, . _ - (up to 64 characters)")
    fields = {k: v for k, v in body.items() if k not in ("name", "description")}
    for key in fields:
        if key in SPEC_FIELDS:
            raise TemplateError(key, "a template holds no per-job data; give it when creating the job")
        if key not in FIELDS:
            raise TemplateError(key, f"unknown template field (fields: name, description, {', '.join(FIELDS)})")
    if "model" not in fields:
        raise TemplateError("model", "required: the base model")
    description = body.get("description", "")
    if not isinstance(description, str):
        raise TemplateError("description", "must be a string")
    if len(description) > 2000:
        raise TemplateError("description", "at most 2000 characters")
    return TemplateBody(name, description, fields)


def _hyperparameters_of(job: dict[str, Any]) -> dict[str, Any]:
    """The dict a job's hyperparameters live in: top level if the template put them there, else
    under the method object (`method.<type>.hyperparameters`) when it has one."""
    method = job.get("method")
    if "hyperparameters" not in job and isinstance(method, dict) and isinstance(method.get("type"), str):
        config = method.setdefault(method["type"], {})
        if isinstance(config, dict):
            nested: dict[str, Any] = config.setdefault("hyperparameters", {})
            return nested
    top: dict[str, Any] = job.setdefault("hyperparameters", {})
    return top


def apply(template: dict[str, Any], call: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The template's fields with the call's laid over them -> (job fields, overridden field paths).
    A call's `hyperparameters` merge key by key into the template's (wherever the template keeps
    them); any other field the call gives replaces the template's whole."""
    job = copy.deepcopy(template)
    overrides: list[str] = []
    for key, value in call.items():
        if key == "hyperparameters" and isinstance(value, dict) and "method" not in call:
            target = _hyperparameters_of(job)
            for hk, hv in value.items():
                if hk in target and target[hk] != hv:
                    overrides.append(f"hyperparameters.{hk}")
                target[hk] = hv
            continue
        if key in job and job[key] != value:
            overrides.append(key)
        job[key] = value
    return job, overrides
