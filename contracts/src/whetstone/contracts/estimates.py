"""The cost estimate an event carries: ingest's per-GPU estimate of a dataset (`dataset.validated`),
which the scheduler extends with the job's runtime and GPU-hours (`job.queued`)."""

from __future__ import annotations

from .base import Contract, GivenFieldsOnly


class CostRow(Contract):
    """Training the dataset's tokens x epochs with one method on one GPU type."""

    gpu_type: str
    method: str
    tokens_per_s_per_gpu: float
    gpu_hours: float
    on_demand_usd: float
    spot_usd: float


class CostEstimate(GivenFieldsOnly):
    """Every field is optional and only the fields given are written back: a dataset's estimate has only
    ingest's figures, a merge job's its merge id and the scheduler's figures, and `over_soft_quota` appears only
    when it is true. The JSON is the same one the producer built, key for key."""

    currency: str | None = None
    tokens: int | None = None
    epochs: int | None = None
    tokens_x_epochs: int | None = None
    tokens_estimated: bool | None = None
    model_params: int | None = None
    params_source: str | None = None
    reference_params: int | None = None
    estimates: list[CostRow] | None = None   # cheapest first
    cheapest: CostRow | None = None
    # added by the scheduler when the job is queued
    merge_id: str | None = None               # a merge job: the merge it runs (it has no dataset estimate)
    remaining_runtime_s: float | None = None  # a resumed job: the runtime still to go
    estimated_runtime_s: float | None = None
    estimated_gpu_hours: float | None = None
    over_soft_quota: bool | None = None
    price_version: str | None = None   # a quote pinned to a price version (metering bills at it)

    def for_job(self, runtime_s: float, gpu_hours: float, over_soft_quota: bool) -> CostEstimate:
        """This estimate with the job's runtime and GPU-hours (and the soft-quota flag when it is over)."""
        extended = self.model_copy(update={"estimated_runtime_s": round(runtime_s, 1),
                                           "estimated_gpu_hours": round(gpu_hours, 4)})
        return extended.model_copy(update={"over_soft_quota": True}) if over_soft_quota else extended
