from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings

from .domain.cost import DEFAULT_PRICES, DEFAULT_THROUGHPUT
from .domain.images import ImageLimits
from .domain.policies import Policies, PolicyOverrides


class IngestSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_INGEST_", extra="ignore")
    http_port: int = 8101
    min_examples: int = 10
    max_examples: int = Field(default=1_000_000, description="limit for tiers not in max_examples_by_tier")
    max_examples_by_tier: dict[str, int] = Field(
        default_factory=lambda: {"free": 10_000, "standard": 1_000_000, "premium": 10_000_000})
    validation_fraction: float = 0.1
    max_upload_bytes: int = 10 * 1024**3
    max_line_bytes: int = Field(default=8 * 1024**2, description="longer JSONL lines / rows are rejected")
    max_unpacked_bytes: int = 16 * 1024**3
    max_compression_ratio: float = 200.0
    max_archive_members: int = 10_000
    disk_reserve_bytes: int = Field(default=256 * 1024**2, ge=0, description="bytes kept free on the disk of "
                                    "work_dir: an upload or unpack that would eat into them is refused (507 "
                                    "insufficient_storage) before it is written, whatever the size limits say")
    storage_quota_bytes: int | None = Field(default=None, ge=0, description="bytes of uploaded files a tenant may "
                                            "keep (None: no quota); an upload past it is 413 storage_quota_exceeded")
    tenant_storage_quota_bytes: dict[str, int] = Field(default_factory=dict, description="tenant -> its own "
                                                       "storage quota in bytes, in place of storage_quota_bytes")
    batch_size: int = 512
    max_image_bytes: int = Field(default=10 * 1024**2, description="bytes per image (decoded), as OpenAI")
    max_image_pixels: int = Field(default=36_000_000, description="pixels per image, read from the header before "
                                  "decoding (decompression bombs)")
    max_images_per_example: int = Field(default=10, ge=1, description="images per example, as OpenAI")
    max_image_examples: int = Field(default=50_000, ge=0, description="examples with images per file, as OpenAI")
    image_fetch: bool = Field(default=False, description="http(s) image URLs fetched at validation (public "
                              "addresses only; the row is rewritten to a data URL of what was fetched, so training "
                              "never fetches); off: refused, embed images as base64 data URLs")
    image_fetch_allow_hosts: list[str] = Field(default_factory=list, description="non-public hosts image URLs may "
                                               "reach (host, address or CIDR, optionally :port), e.g. a test server")
    image_fetch_timeout_s: float = Field(default=10.0, gt=0, description="one image fetch, resolution included")
    workers: int = Field(default=1, ge=1, description="processes for the gate's pure per-row work (1, the default:"
                         " no pool; measured on 2 cores, the pool cost 20-50 % more CPU per row than it saved);"
                         " results are identical either way")
    validation_workers: int = Field(default=1, ge=1, description="uploads validated at once by this process")
    validation_lease_s: float = Field(default=30.0, gt=0, description="a claimed validation whose worker stopped "
                                      "renewing (renewed every third of this) is taken over after this long")
    validation_poll_s: float = 2.0
    validation_backoff_s: float = Field(default=2.0, description="first pause after a failed validation attempt "
                                        "(doubling, capped at validation_backoff_max_s)")
    validation_backoff_max_s: float = 60.0
    wandb_timeout_s: float = Field(default=120.0, gt=0, description="one W&B offline run written by the SDK's "
                                   "process (killed past it; the attempt counts as failed)")
    wandb_lease_s: float = Field(default=60.0, gt=0, description="a claimed W&B run whose worker stopped renewing "
                                 "is taken over after this long")
    wandb_poll_s: float = 5.0
    wandb_max_attempts: int = Field(default=3, ge=1, description="W&B run writes tried before it is given up")
    wandb_backoff_s: float = Field(default=2.0, gt=0, description="first pause after a failed W&B run write")
    default_epochs: int = 3
    default_policies: PolicyOverrides = Field(default_factory=PolicyOverrides,
                                              description="overrides of the Policies defaults")
    tenant_policies: dict[str, PolicyOverrides] = Field(default_factory=dict, description="tenant -> policy overrides")
    reference_dirs: list[Path] = Field(default_factory=list, description="benchmark/eval sets for contamination")
    hub_benchmarks: bool = Field(default=False, description="fetch MMLU, HellaSwag, ARC, TruthfulQA, GSM8K when "
                                 "the Hub is reachable (cached under benchmark_cache_dir)")
    benchmark_cache_dir: Path | None = None
    toxicity_classifier: str = Field(default="builtin", description="builtin | off | package.module:attr")
    throughput_table: dict[str, dict[str, float]] = Field(default_factory=lambda: DEFAULT_THROUGHPUT)
    gpu_prices: dict[str, dict[str, float]] = Field(default_factory=lambda: DEFAULT_PRICES)
    work_dir: Path | None = Field(default=None, description="scratch space for uploads; default: system temp")

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(self.max_image_bytes, self.max_image_pixels, self.max_images_per_example,
                           self.max_image_examples, self.image_fetch, tuple(self.image_fetch_allow_hosts),
                           self.image_fetch_timeout_s)

    @property
    def max_record_bytes(self) -> int:
        """The longest line read: `max_line_bytes` of text plus the images an example may carry as base64
        (a longer line is refused unread; a row's text is still held to `max_line_bytes`)."""
        limits = self.image_limits
        return self.max_line_bytes + limits.max_per_example * limits.max_base64_chars

    def policies_for(self, tenant_id: str) -> Policies:
        return Policies().merged(self.default_policies).merged(self.tenant_policies.get(tenant_id))

    def storage_quota_for(self, tenant_id: str) -> int | None:
        return self.tenant_storage_quota_bytes.get(tenant_id, self.storage_quota_bytes)

    def max_examples_for(self, tier: str | None) -> int:
        return self.max_examples_by_tier.get(tier or "", self.max_examples)
