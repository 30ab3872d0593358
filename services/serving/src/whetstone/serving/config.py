from pydantic import Field
from pydantic_settings import SettingsConfigDict

from whetstone.modelkit.image_rules import ImageLimits
from whetstone.runtime.settings import ServiceSettings


class ServingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_SERVING_", extra="ignore")
    http_port: int = 8107
    base_model: str = Field(default="tiny-llama", description="the one base served: catalog name, local dir or Hub id")
    max_resident_adapters: int = Field(default=64, ge=1, description="LRU budget of adapters kept in memory")
    batch_window_ms: float = Field(default=4.0, ge=0, description="how long the batcher collects requests")
    max_batch_size: int = Field(default=64, ge=1, description="rows per forward pass (vLLM: max_num_seqs)")
    mixed_batches: bool = Field(default=True, description="false: one adapter per forward pass (the baseline)")
    default_max_tokens: int = Field(default=64, ge=1)
    # fair sharing (usecases/inference.py): checked before anything is rendered, tokenised or queued
    max_queued_per_tenant: int = Field(default=32, ge=1, description="completion requests of one tenant in the "
                                       "batcher at once (queued or generating); past it: 429")
    max_prompt_chars: int = Field(default=256_000, ge=1, description="characters of one request's whole prompt "
                                  "(all messages); past it: 400 prompt_too_long, before tokenising")
    max_messages: int = Field(default=2048, ge=1, le=2048, description="messages of one chat request (OpenAI's "
                              "limit, 2048, at most); past it: 400 too_many_messages naming `messages`, before "
                              "rendering")
    max_prompt_tokens: int = Field(default=0, ge=0, description="tokens of one prompt once rendered and tokenised; "
                                   "past it: 400 prompt_too_long naming `messages`/`prompt`; 0: the model's "
                                   "context length is the only bound")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads; 0: all cores but one "
                               "(left to the event loop that feeds the engine)")
    preload: bool = Field(default=True, description="load adapters when promoted, not only on first request")
    max_lora_rank: int = Field(default=64, ge=1, description="the largest LoRA rank accepted (vLLM: max_lora_rank)")
    full_model_budget_mb: int = Field(default=4096, ge=0, description="memory for full-weight models (full "
                                      "fine-tunes, continued pre-training) served beside the base, each as a base of "
                                      "its own: the safetensors bytes of those resident at once; a model larger "
                                      "than this is refused with 409 model_exceeds_serving_budget (serve it with "
                                      "vLLM); 0: none are served here")
    fetch_max_wait_ms: int = Field(default=50, ge=1, description="Kafka fetch wait: bounds promotion -> loaded latency")
    # images in chat requests (a vision-language base): ingest's limits, by default the same values
    max_image_bytes: int = Field(default=10 * 1024**2, ge=1, description="bytes per image (decoded), as ingest")
    max_image_pixels: int = Field(default=36_000_000, ge=1, description="pixels per image, read from the header "
                                  "before decoding, as ingest")
    max_images_per_request: int = Field(default=10, ge=1, description="images per chat request (ingest: per example)")
    image_fetch: bool = Field(default=False, description="http(s) image URLs fetched per request (public addresses "
                              "only, as ingest); off: refused with a 400, send images as base64 data URLs")
    image_fetch_allow_hosts: list[str] = Field(default_factory=list, description="non-public hosts image URLs may "
                                               "reach (host, address or CIDR, optionally :port), e.g. a test server")
    image_fetch_timeout_s: float = Field(default=10.0, gt=0, description="one image fetch, resolution included")

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels,
                           max_per_example=self.max_images_per_request, allow_fetch=self.image_fetch,
                           fetch_allow_hosts=tuple(self.image_fetch_allow_hosts),
                           fetch_timeout_s=self.image_fetch_timeout_s)
