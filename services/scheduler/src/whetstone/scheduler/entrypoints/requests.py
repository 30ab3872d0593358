"""The create-job body as OpenAI's client sends it, turned into the platform's `JobRequestedV1`.

`method` is OpenAI's object, `{"type": "supervised" | "dpo", "supervised" | "dpo": {"hyperparameters":
{...}}}`. The platform's own methods are an extension that stays valid for the client:
`"whetstone": {"method": "qlora"}` beside `type` (supervised: lora (default), qlora, full, cpt; dpo:
dpo (default), orpo), or `type` naming the platform method itself (`{"type": "qlora", "qlora":
{"hyperparameters": ...}}`), or a plain string (`"method": "qlora"`, the platform's older form).
Top-level `hyperparameters` (deprecated by OpenAI, still sent by older clients) are accepted when
the method object carries none. `"auto"` means the platform's default; `learning_rate_multiplier`
scales the method's default learning rate."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from whetstone.contracts import Hyperparameters, JobRequestedV1, ResourceRequest
from whetstone.contracts.base import Contract, JsonAtMost
from whetstone.contracts.enums import IntegrationType
from whetstone.contracts.integrations import Integration, MlflowIntegration, WandbIntegration
from whetstone.contracts.events import MAX_GRADER_JSON_BYTES
from whetstone.graders import GraderEnvironment
from whetstone.runtime.errors import ApiError, FieldError

from ..domain import jobs as rules
from ..domain.templates import image_problem
from ..usecases.rft import reinforcement_spec

PLATFORM_METHODS = ("lora", "qlora", "full", "cpt", "dpo", "orpo")
FAMILY = {"lora": "supervised", "qlora": "supervised", "full": "supervised", "cpt": "supervised",
          "dpo": "dpo", "orpo": "dpo", "reinforcement": "reinforcement"}
DEFAULT_FOR = {"supervised": "lora", "dpo": "dpo"}


# OpenAI's own limits where it has them (metadata: 16 pairs, keys 64 characters, values 512)
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
# a file id as the Files API mints it (`file-<hex>`) or a content address (`ds-<hex>`): letters, digits, . _ : -
FileId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
# an idempotency key (body or `Idempotency-Key` header): 1-255 characters, a UUID, a slug or base64 fit
IDEMPOTENCY_KEY = r"^[A-Za-z0-9._:~+=/@-]{1,255}$"
Hyperparams = Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Any], Field(max_length=40),
                        JsonAtMost(4096)]


class MethodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: Hyperparams = Field(default_factory=dict)


class PlatformMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["lora", "qlora", "full", "cpt", "dpo", "orpo"]


class MethodSpec(BaseModel):
    model_config = ConfigDict(extra="allow")   # the config object under the platform method's own name
    type: Literal["supervised", "dpo", "reinforcement", "lora", "qlora", "full", "cpt", "orpo"]
    supervised: MethodConfig | None = None
    dpo: MethodConfig | None = None
    reinforcement: Annotated[dict[str, Any], JsonAtMost(MAX_GRADER_JSON_BYTES + 16384)] | None = None   # rft.py checks it
    whetstone: PlatformMethod | None = None


class CreateJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # every field bounded: no body can make an event larger than the bus takes
    model: str | None = Field(default=None, min_length=1, max_length=256)   # required unless a template gives it
    template: str | None = Field(default=None, min_length=1, max_length=80, description="'name' or 'name@version'")
    training_file: FileId
    validation_file: FileId | None = None
    # a platform method's config travels under its own name (extra fields): the whole object is bounded
    method: Annotated[MethodSpec, JsonAtMost(MAX_GRADER_JSON_BYTES + 32768)] | Literal[
        "lora", "qlora", "full", "cpt", "dpo", "orpo"] | None = None
    hyperparameters: Hyperparams | None = None
    suffix: str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)
    integrations: list[Annotated[dict[str, Any], JsonAtMost(2048)]] | None = Field(default=None, max_length=8)
    tier: str | None = Field(default=None, max_length=32)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255, pattern=IDEMPOTENCY_KEY)
    resources: Literal["auto"] | ResourceRequest = "auto"
    eval_config: Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Any], Field(max_length=32),
                           JsonAtMost(16384)] | None = None
    # the pin `whet jobs reproduce` sends: a catalog base's weights sha256, or a Hub commit
    base_model_sha256: str | None = Field(default=None, max_length=64, pattern=r"^([0-9a-f]{40}|[0-9a-f]{64})$")
    # the trainer image by digest (a template's pin, kept by `whet jobs reproduce`); checked in to_request
    image: str | None = Field(default=None, min_length=1, max_length=300)


RFT_ADAPTERS = ("lora", "qlora")   # method.whetstone.method of a reinforcement job
INTEGRATION_BLOCKS: dict[IntegrationType, type[Contract]] = {
    IntegrationType.WANDB: WandbIntegration, IntegrationType.MLFLOW: MlflowIntegration}


def check_integrations(items: list[dict[str, Any]], mlflow_configured: bool = False) -> list[Integration]:
    """OpenAI's `integrations` (and the platform's `mlflow`), checked field by field (each error names
    `integrations[i]...`, down to the unknown or missing field of a block); one integration of each type.

    A W&B block is accepted and runs OFFLINE: ingest writes a W&B offline run of the job (config, one
    history row per step, summary) and makes it a second result file, `<job>-wandb-offline.tar.gz`, for
    the tenant to `wandb sync`. Online logging with a W&B key the tenant stored is not built (the platform
    stores no W&B keys). An MLflow block is refused where the operator set no tracking server."""
    out: list[Integration] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"integrations[{i}]"
        kind = item.get("type")
        if kind not in INTEGRATION_BLOCKS:
            raise bad(f"{where}.type", f"unknown integration type {str(kind)[:64]!r} (supported: "
                      f"{', '.join(INTEGRATION_BLOCKS)})", code="unsupported_integration")
        if kind in seen:
            raise bad(f"{where}.type", f"a second {kind!r} integration: a job takes one of each type")
        seen.add(kind)
        if stray := sorted(set(item) - {"type", kind}):
            raise bad(f"{where}.{stray[0][:64]}", "unknown field")
        if kind not in item:
            raise bad(f"{where}.{kind}", "Field required", code="missing_required_parameter")
        block_type = INTEGRATION_BLOCKS[IntegrationType(kind)]
        block = item[kind]
        if isinstance(block, dict) and (stray := sorted(set(block) - set(block_type.model_fields))):
            raise bad(f"{where}.{kind}.{str(stray[0])[:64]}", "unknown field")
        try:
            block_type.model_validate(block)
        except ValidationError as exc:
            error = FieldError.first_of(exc)
            code = "missing_required_parameter" if error.missing else "invalid_value"
            raise bad(f"{where}.{kind}" + (f".{error.path}" if error.path else ""), error.message, code=code) from exc
        if kind == IntegrationType.MLFLOW and not mlflow_configured:
            raise bad(f"{where}.{kind}", "this platform's operator set no MLflow tracking server "
                      "(WHETSTONE_MLFLOW_TRACKING_URI); leave integrations out", code="integration_not_configured")
        out.append(Integration.model_validate(item))
    return out


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", code=code, param=param)


def platform_method(body: CreateJob) -> tuple[str, dict[str, Any]]:
    """(platform method, the hyperparameters given with it)."""
    m = body.method
    if m is None or isinstance(m, str):
        return m or "lora", {}
    if m.type == "reinforcement":   # its knobs travel in the reinforcement spec (rft.py), not as hyperparameters
        stray = sorted(set(m.model_extra or {}) | {f for f in ("supervised", "dpo") if getattr(m, f)})
        if stray:
            raise bad(f"method.{stray[0]}", "unknown field for method.type 'reinforcement'")
        if m.whetstone and m.whetstone.method not in RFT_ADAPTERS:
            raise bad("method.whetstone.method", f"{str(m.whetstone.method)!r} does not apply to reinforcement "
                      f"(it trains a LoRA adapter: {' or '.join(RFT_ADAPTERS)}, QLoRA on a 4-bit base)")
        return "reinforcement", {}
    if m.type in ("supervised", "dpo"):
        method = m.whetstone.method if m.whetstone else DEFAULT_FOR[m.type]
        if FAMILY[method] != m.type:
            raise bad("method.whetstone.method", f"{str(method)!r} is not a {m.type} method "
                      f"(fits: {', '.join(k for k, v in FAMILY.items() if v == m.type)})")
        config = getattr(m, m.type)
    else:
        method = m.type
        if m.whetstone and m.whetstone.method != method:
            raise bad("method.whetstone.method", f"{str(m.whetstone.method)!r} contradicts method.type {str(method)!r}")
        extra = (m.model_extra or {}).get(method) or getattr(m, FAMILY[method], None)
        try:
            config = MethodConfig.model_validate(extra) if isinstance(extra, dict) else extra
        except ValidationError as exc:
            raise bad(f"method.{method}", FieldError.first_of(exc).message) from exc
    unknown = set(m.model_extra or {}) - {method}
    if unknown:
        raise bad(f"method.{sorted(unknown)[0]}", "unknown field")
    return method, dict(config.hyperparameters) if config else {}


def hyperparameters(method: str, given: dict[str, Any], param: str) -> Hyperparameters:
    """'auto' -> the default; learning_rate_multiplier -> learning_rate; ranges from the contract."""
    hp = {k: v for k, v in given.items() if v != "auto" or k == "batch_size"}
    if "learning_rate_multiplier" in hp:
        multiplier = hp.pop("learning_rate_multiplier")
        if not isinstance(multiplier, int | float) or multiplier <= 0:
            raise bad(f"{param}.learning_rate_multiplier", "must be a number > 0 or 'auto'")
        if hp.get("learning_rate") is not None:
            raise bad(f"{param}.learning_rate_multiplier", "give learning_rate or learning_rate_multiplier, not both")
        default = rules.default_learning_rate(method)
        if default is None:
            raise bad(f"{param}.learning_rate_multiplier", f"method {method!r} has no default learning rate to scale")
        hp["learning_rate"] = default * multiplier
    try:
        return Hyperparameters(**hp)
    except ValidationError as exc:
        error = FieldError.first_of(exc)
        raise bad(f"{param}.{error.path}" if error.path else param, error.message) from exc
    except TypeError as exc:
        raise bad(param, str(exc)) from exc


def to_request(body: CreateJob, job_id: str, key: str, graders: GraderEnvironment, *,
               mlflow_configured: bool = False) -> JobRequestedV1:
    if not re.fullmatch(IDEMPOTENCY_KEY, key):
        raise bad("Idempotency-Key", "must be 1 to 255 characters of A-Z a-z 0-9 . _ : ~ + = / @ -")
    if not body.model:
        raise bad("model", "Field required (or name a template that gives it)", code="missing_required_parameter")
    method, nested = platform_method(body)
    if nested and body.hyperparameters:
        raise bad("hyperparameters", "give hyperparameters under method.<type>.hyperparameters or at the top level "
                  "(deprecated), not both")
    given = nested or dict(body.hyperparameters or {})
    param = f"method.{body.method.type}.hyperparameters" if nested and isinstance(body.method, MethodSpec) \
        else "hyperparameters"
    if body.seed is not None:
        if given.get("seed") not in (None, body.seed):
            raise bad("seed", "contradicts hyperparameters.seed")
        given["seed"] = body.seed
    integrations = check_integrations(body.integrations or [], mlflow_configured)
    if body.image is not None and (problem := image_problem(body.image)):
        raise bad("image", problem)
    spec = None
    if method == "reinforcement":
        if body.hyperparameters:
            raise bad("hyperparameters", "a reinforcement job takes its hyperparameters under "
                      "method.reinforcement.hyperparameters")
        spec = reinforcement_spec(body.method.reinforcement, graders)
        if body.method.whetstone and body.method.whetstone.method == "qlora":
            spec = spec.model_copy(update={"base_quantization": "nf4"})
        given.update(n_epochs=spec.n_epochs, learning_rate=spec.learning_rate, batch_size=spec.batch_size)
    return JobRequestedV1(job_id=job_id, idempotency_key=key, model=body.model, training_file=body.training_file,
                          validation_file=body.validation_file, method=method,
                          hyperparameters=hyperparameters(method, given, param), suffix=body.suffix, tier=body.tier,
                          resources=body.resources if isinstance(body.resources, ResourceRequest) else None,
                          eval_config=body.eval_config, reinforcement=spec, base_model_sha256=body.base_model_sha256,
                          image=body.image, integrations=integrations)
