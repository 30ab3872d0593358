"""Which weights answer a request: model versions, stages, the base-model guard. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SERVABLE_STAGES = frozenset({"staging", "production"})


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


@dataclass(frozen=True)
class ModelVersion:
    """The serving projection of one registered model (one adapter artifact)."""

    model_id: str
    tenant_id: str
    name: str
    stage: str
    artifact_uri: str | None = None
    artifact_sha256: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    base_model: str | None = None
    base_model_sha256: str | None = None
    chat_template_sha256: str | None = None
    sequence: int = 0

    @property
    def servable(self) -> bool:
        return self.stage in SERVABLE_STAGES


def choose_version(requested: str, candidates: Sequence[ModelVersion]) -> ModelVersion:
    """`requested` is a model id (exact version) or a model name: production first, else the
    newest staging version. Candidates are the caller's own versions matching either."""
    exact = [c for c in candidates if c.model_id == requested]
    named = exact or [c for c in candidates if c.name == requested]
    if not named:
        raise ModelNotFound(f"The model `{requested}` does not exist or you do not have access to it.")
    live = sorted((c for c in named if c.servable), key=lambda c: (c.stage == "production", c.sequence), reverse=True)
    if not live:
        newest = max(named, key=lambda c: c.sequence)
        raise ModelNotDeployed(f"The model `{requested}` is {newest.stage}, not deployed: only staging and "
                               "production models are served.")
    return live[0]


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
        self.routes: dict[tuple[str, str], object] = {}  # (tenant, name) -> routing.Route

    def put(self, version: ModelVersion) -> None:
        old = self.versions.get(version.model_id)
        if old is not None:
            self._by_name.get((old.tenant_id, old.name), set()).discard(old.model_id)
        self.versions[version.model_id] = version
        self._by_name.setdefault((version.tenant_id, version.name), set()).add(version.model_id)

    def candidates(self, tenant_id: str, requested: str) -> list[ModelVersion]:
        ids = set(self._by_name.get((tenant_id, requested), ()))
        exact = self.versions.get(requested)
        if exact is not None and exact.tenant_id == tenant_id:
            ids.add(requested)
        return [self.versions[i] for i in ids]

    def owned(self, tenant_id: str, model_ids: Sequence[str]) -> dict[str, ModelVersion]:
        return {m: v for m in model_ids if (v := self.versions.get(m)) is not None and v.tenant_id == tenant_id}

    def put_route(self, tenant_id: str, name: str, route: object | None) -> None:
        if route is None:
            self.routes.pop((tenant_id, name), None)
        else:
            self.routes[(tenant_id, name)] = route
