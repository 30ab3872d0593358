"""The consumers a service subscribes with refresh topic metadata every `kafka_metadata_max_age_s`, not
after Kafka's 5-minute default. A chaos run showed why: metering restarted while the broker was
answering metadata requests with UnknownError, its consumer joined the group holding no partitions,
and it stayed idle, billing nothing, until the run ended. A refresh that sees the topics rejoins."""

from __future__ import annotations

from whetstone.runtime.service import kafka_broker
from whetstone.runtime.settings import CommonSettings


def consumer_options(settings: CommonSettings) -> dict:
    return kafka_broker(settings, "whetstone-probe").config.broker_config.builder.keywords


def test_consumers_refresh_metadata_every_15_s_by_default():
    assert CommonSettings(kafka_bootstrap="127.0.0.1:9092").kafka_metadata_max_age_s == 15.0
    assert consumer_options(CommonSettings(kafka_bootstrap="127.0.0.1:9092"))["metadata_max_age_ms"] == 15_000


def test_the_refresh_period_is_a_setting(monkeypatch):
    monkeypatch.setenv("WHETSTONE_KAFKA_METADATA_MAX_AGE_S", "2.5")
    settings = CommonSettings(kafka_bootstrap="127.0.0.1:9092")
    assert consumer_options(settings)["metadata_max_age_ms"] == 2_500
    assert consumer_options(settings)["client_id"] == "whetstone-probe"
