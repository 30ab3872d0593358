from pydantic_settings import SettingsConfigDict

from whetstone.runtime.settings import ServiceSettings


class MeteringSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_METERING_", extra="ignore")
    http_port: int = 8105
    batch_size: int = 2000            # records fetched at a time (0: one message per transaction)
    batch_concurrency: int = 3        # ... split by job into this many concurrent transactions (with the
                                      # pool of 5: relay and trace writer keep theirs; 4 measured no better)
    # grace periods, in event time (domain/clock.py)
    orphan_grace_s: float = 600.0     # a stop whose start never arrives becomes an anomaly after this
    close_grace_s: float = 120.0      # a job total waits this long for segments it cannot count
    sweep_interval_s: float = 5.0     # how often the grace periods are checked
    metrics_interval_s: float = 15.0  # how often the usage gauges are refreshed from the roll-ups
    state_cache_jobs: int = 50_000    # jobs whose state is kept in memory between batches (LRU)
    # Kafka group membership: a static instance id (e.g. the pod name of a StatefulSet) lets a
    # restarted replica take its partitions back without waiting for its old session to expire.
    group_instance_id: str | None = None
    session_timeout_ms: int = 10_000
