"""Gateway settings (prefix WHETSTONE_GATEWAY_; the public port is WHETSTONE_API_PORT)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

SERVICES = ("scheduler", "ingest", "registry", "metering", "serving")


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_GATEWAY_", extra="ignore")

    http_port: int = Field(default=8000, validation_alias=AliasChoices("WHETSTONE_API_PORT",
                                                                       "WHETSTONE_GATEWAY_HTTP_PORT"))
    host: str = "127.0.0.1"
    upstreams: dict[str, str] = Field(default_factory=dict,
                                      description='service -> base URL, e.g. {"scheduler": "http://scheduler:8100"}')
    scheduler_url: str | None = None
    ingest_url: str | None = None
    registry_url: str | None = None
    metering_url: str | None = None
    serving_url: str | None = None
    key_cache_ttl_s: float = Field(default=2.0, ge=0, le=2.0,
                                   description="how long a key's verdict is reused: a revoked key stops within this")
    rate_limit_per_s: float = Field(default=50.0, gt=0, description="per-key request rate (keys may set their own)")
    rate_limit_burst_s: float = Field(default=2.0, gt=0, description="bucket size, in seconds of the key's rate")
    upstream_timeout_s: float = Field(default=600.0, gt=0, description="read timeout towards a service (SSE included)")
    max_connections: int = 512
    max_body_bytes: int = Field(default=1 << 20, gt=0, description="largest request body of a route (JSON); "
                                "larger: 413, before it is read when Content-Length says so")
    upload_paths: list[str] = Field(default_factory=lambda: ["/v1/files"],
                                    description="routes that stream a large body (uploads), up to max_upload_bytes")
    max_upload_bytes: int = Field(default=10 * 1024**3, gt=0, description="largest upload (ingest's own cap is "
                                  "WHETSTONE_INGEST_MAX_UPLOAD_BYTES)")
    # fair sharing (fairness.py): budgets per API key and per tenant, refused with a 429 before any upstream work
    max_in_flight_per_key: int = Field(default=4, ge=1, description="requests of one key inside the services "
                                       "at once; more wait their turn (max_queued_per_tenant, queue_wait_s)")
    max_in_flight_per_tenant: int = Field(default=8, ge=1, description="requests of all a tenant's keys inside "
                                          "the services at once")
    max_in_flight_per_service: dict[str, int] = Field(
        default_factory=lambda: {"scheduler": 4, "registry": 4, "metering": 4},
        description="requests of all tenants inside a service at once (below its database pool of 5); a freed "
                    "place goes to the waiting tenant with the fewest requests inside (fairness.SharedSlots). A "
                    "service not named has no shared cap: ingest streams long uploads, serving batches completions "
                    "and caps each tenant's pending requests itself")
    max_in_flight_per_service_per_tenant: int = Field(
        default=1, ge=0, description="of a service's max_in_flight_per_service places, the most one tenant holds "
        "(0: all): its other requests wait at the edge, so another tenant's request goes in at once rather than "
        "beside the first tenant's flood (in one event loop, requests in flight together slow each other down)")
    max_queued_per_tenant: int = Field(default=64, ge=0, description="requests waiting for a slot; past it: 429")
    queue_wait_s: float = Field(default=10.0, ge=0, description="longest wait for a slot before a 429")
    max_streams_per_key: int = Field(default=8, ge=1, description="server-sent-event streams open per key")
    max_streams_per_tenant: int = Field(default=8, ge=1, description="server-sent-event streams open per tenant")
    stream_retry_after_s: float = Field(default=5.0, gt=0, description="Retry-After of a refused stream")
    tenant_rate_limit_per_s: float = Field(default=50.0, gt=0, description="request rate of all a tenant's keys "
                                           "together (each key also has its own, rate_limit_per_s)")
    tenant_rate_limits: dict[str, float] = Field(default_factory=dict, description="operator overrides of "
                                                 "tenant_rate_limit_per_s, by tenant id")
    replicas: int = Field(default=1, ge=1, description="gateway replicas behind the load balancer: each holds "
                          "1/replicas of every in-flight budget, and of the tenant rate when it has no database")
    shared_rate_lease_s: float = Field(default=0.5, gt=0, le=5, description="with a database (shared tenant "
                                       "rates, shared_limits.py): a replica takes this many seconds of a tenant's "
                                       "rate from the shared bucket per round trip, and drops what it has not "
                                       "spent after as long (long enough that a top-up behind the requests comes "
                                       "back before the lease runs out when the database is slow under load)")
    database_pool_size: int = Field(default=4, ge=1, le=32, description="connections to the gateway's database "
                                    "(shared tenant rates), when it has one")
    limits_ttl_s: float = Field(default=2.0, gt=0, le=60, description="how long a replica reuses the operator's "
                                "tenant rate overrides it read: a change reaches every replica within this")
    max_stream_connections: int = Field(default=1024, ge=1, description="connections of the separate pool "
                                        "that carries long streams (ordinary requests have max_connections)")
    keep_alive_s: int = Field(default=75, description="idle keep-alive towards clients (longer than theirs)")
    upstream_keep_alive_s: float = Field(default=2.0, description="idle keep-alive towards the services: shorter "
                                         "than their servers' 5 s, so a reused connection is never one being closed")

    def resolved_upstreams(self) -> dict[str, str]:
        one_by_one = {s: getattr(self, f"{s}_url") for s in SERVICES if getattr(self, f"{s}_url")}
        return {k: v.rstrip("/") for k, v in {**one_by_one, **self.upstreams}.items() if v}
