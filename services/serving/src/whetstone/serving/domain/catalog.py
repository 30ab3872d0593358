"""Which weights answer a request: model versions, stages, the base-model guard. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic.dataclasses import dataclass as record

from whetstone.contracts.enums import ModelStage
from whetstone.runtime.weights import holds_full_weights

if TYPE_CHECKING:
    from .routing import Route

SERVABLE_STAGES = frozenset({ModelStage.STAGING, ModelStage.PRODUCTION})


class ServingError(Exception):
    """A request that cannot be served; `status`/`code` become the OpenAI-shaped error."""

    status = 400
    code = "invalid_request"
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param


class ModelNotFound(ServingError):
    status, code, param = 404, "model_not_found", "model"


class ModelNotDeployed(ServingError):
    status, code, param = 404, "model_not_deployed", "model"


class BaseModelMismatch(ServingError):
    status, code, param = 422, "base_model_mismatch", "model"


class AdapterCorrupted(ServingError):
    status, code, param = 422, "adapter_corrupted", "model"


class ChatTemplateMismatch(ServingError):
    status, code, param = 422, "chat_template_mismatch", "model"


class ContextLengthExceeded(ServingError):
    status, code = 400, "context_length_exceeded"


class CapacityExhausted(ServingError):
    status, code = 503, "adapter_capacity_exhausted"


@record(frozen=True)
class ModelVersion:
    """The serving projection of one registered model (one adapter artifact)."""

    model_id: str
    tenant_id: str
    name: str
    stage: ModelStage
    artifact_uri: str | None = None
    artifact_sha256: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    base_model: str | None = None
    base_model_sha256: str | None = None
    chat_template_sha256: str | None = None
    sequence: int = 0
    fine_tuned_model: str | None = None  # the public id (OpenAI's fine_tuned_model)
    job_id: str | None = None

    @property
    def servable(self) -> bool:
        return self.stage in SERVABLE_STAGES


def choose_version(requested: str, candidates: Sequence[ModelVersion]) -> ModelVersion:
    """`requested` is a version's public or internal id (exact version) or a model name: production
    first, else the newest staging version. Candidates are the caller's own versions matching either."""
    exact = [c for c in candidates if requested in (c.model_id, c.fine_tuned_model)]
    named = exact or [c for c in candidates if c.name == requested]
    if not named:
        raise ModelNotFound(f"The model `{requested}` does not exist or you do not have access to it.")
    live = sorted((c for c in named if c.servable), key=lambda c: (c.stage == ModelStage.PRODUCTION, c.sequence),
                  reverse=True)
    if not live:
        newest = max(named, key=lambda c: c.sequence)
        raise ModelNotDeployed(f"The model `{requested}` is {newest.stage}, not deployed: only staging and "
                               "production models are served.")
    return live[0]


BASE_ADAPTER = "whetstone:base"  # the engine's adapter slot 0: the base model alone, no adapter


def base_version(tenant_id: str, name: str, sha256: str) -> ModelVersion:
    """The served base model itself, as a version any tenant may call (OpenAI's base models)."""
    return ModelVersion(model_id=BASE_ADAPTER, tenant_id=tenant_id, name=name, stage=ModelStage.PRODUCTION,
                        base_model=name, base_model_sha256=sha256)


@record(frozen=True)
class StoredCheckpoint:
    """A durable checkpoint of a job, as checkpoint.written announced it."""

    uri: str
    manifest_sha256: str


def checkpoint_version(parent: ModelVersion | None, requested: str, step: int,
                       stored: StoredCheckpoint | None) -> ModelVersion:
    """A checkpoint of a registered model's job (`<fine_tuned_model>:ckpt-step-<N>`, OpenAI's
    fine_tuned_model_checkpoint), served like a version of its own: only once the job's model passed the
    eval gate (staging or production), on the same base and chat template."""
    if parent is None:
        raise ModelNotFound(f"The model `{requested}` does not exist or you do not have access to it: a checkpoint "
                            "is served once its job's model is registered.")
    if not parent.servable:
        raise ModelNotDeployed(f"The checkpoint `{requested}` belongs to `{parent.fine_tuned_model}`, which is "
                               f"{parent.stage}: checkpoints of a job are served only while its model is staging or "
                               "production.")
    if holds_full_weights(parent.files):
        raise ModelNotDeployed(f"`{requested}` is a checkpoint of the full-weight model `{parent.fine_tuned_model}`: "
                               "this server serves a full-weight model's final weights only (its checkpoints hold "
                               f"optimizer state beside the weights); call `{parent.fine_tuned_model}`.")
    if stored is None:
        raise ModelNotFound(f"The job of `{parent.fine_tuned_model}` wrote no checkpoint at step {step}.")
    return ModelVersion(model_id=requested, tenant_id=parent.tenant_id, name=requested, stage=parent.stage,
                        artifact_uri=stored.uri, artifact_sha256=stored.manifest_sha256, base_model=parent.base_model,
                        base_model_sha256=parent.base_model_sha256, chat_template_sha256=parent.chat_template_sha256,
                        fine_tuned_model=requested, job_id=parent.job_id)


def check_servable_on(version: ModelVersion, served_base_sha256: str) -> None:
    """Nothing is served on other weights than the adapter was trained on."""
    if not version.artifact_uri or not version.artifact_sha256:
        raise AdapterCorrupted(f"The model `{version.name}` has no artifact recorded; it cannot be served.")
    if version.base_model_sha256 != served_base_sha256:
        raise BaseModelMismatch(
            f"The model `{version.name}` was trained on base {version.base_model or '?'} at sha256 "
            f"{(version.base_model_sha256 or 'unknown')[:12]}…; this server runs sha256 {served_base_sha256[:12]}….")


class AdapterIncompatible(ServingError):
    status, code, param = 422, "adapter_incompatible", "model"


class AdapterUnavailable(ServingError):
    """The object store could not be read right now: retryable, never cached."""

    status, code = 503, "adapter_unavailable"


def completion_budget(prompt_tokens: int, requested: int | None, default: int, context: int, param: str) -> int:
    """Tokens a completion may generate; ContextLengthExceeded (OpenAI's wording) when it cannot fit."""
    if prompt_tokens >= context or (requested is not None and prompt_tokens + requested > context):
        asked = f" ({prompt_tokens} in the {param}, {requested} in the completion)" if requested else ""
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + (requested or 0)} tokens{asked}. Please reduce the length of the {param}"
            f"{' or completion' if requested else ''}.", param=param)
    return requested if requested is not None else min(default, context - prompt_tokens)


class LiveCatalog:
    """The projection held in memory (kept current by the projection follower), so a request
    resolves its model without a database round trip. Pure."""

    def __init__(self) -> None:
        self.versions: dict[str, ModelVersion] = {}
        self._by_name: dict[tuple[str, str], set[str]] = {}
        self._by_public: dict[tuple[str, str], str] = {}   # (tenant, fine_tuned_model) -> model_id
        self.routes: dict[tuple[str, str], Route] = {}  # (tenant, name) -> its A/B route

    def put(self, version: ModelVersion) -> None:
        old = self.versions.get(version.model_id)
        if old is not None:
            self._by_name.get((old.tenant_id, old.name), set()).discard(old.model_id)
        self.versions[version.model_id] = version
        self._by_name.setdefault((version.tenant_id, version.name), set()).add(version.model_id)
        if version.fine_tuned_model:
            self._by_public[(version.tenant_id, version.fine_tuned_model)] = version.model_id

    def candidates(self, tenant_id: str, requested: str) -> list[ModelVersion]:
        ids = set(self._by_name.get((tenant_id, requested), ()))
        exact = self.versions.get(self._by_public.get((tenant_id, requested), requested))
        if exact is not None and exact.tenant_id == tenant_id:
            ids.add(exact.model_id)
        return [self.versions[i] for i in ids]

    def public(self, tenant_id: str, fine_tuned_model: str) -> ModelVersion | None:
        """The tenant's version whose public id is `fine_tuned_model`."""
        model_id = self._by_public.get((tenant_id, fine_tuned_model))
        return self.versions.get(model_id) if model_id else None

    def owned(self, tenant_id: str, model_ids: Sequence[str]) -> dict[str, ModelVersion]:
        """The tenant's versions named by internal or public id, keyed by the name given."""
        found = {m: self.versions.get(self._by_public.get((tenant_id, m), m)) for m in model_ids}
        return {m: v for m, v in found.items() if v is not None and v.tenant_id == tenant_id}

    def put_route(self, tenant_id: str, name: str, route: Route | None) -> None:
        if route is None:
            self.routes.pop((tenant_id, name), None)
        else:
            self.routes[(tenant_id, name)] = route
