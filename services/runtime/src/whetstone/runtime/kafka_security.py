"""Kafka client security from CommonSettings (WHETSTONE_KAFKA_SECURITY_PROTOCOL, _SASL_*): the FastStream
broker's `security` object; aiokafka clients take `settings.kafka_client_options()`."""

from __future__ import annotations

from typing import Any

from .settings import CommonSettings


def broker_security(settings: CommonSettings) -> Any:
    from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512  # noqa: PLC0415

    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    options = settings.kafka_client_options()
    use_ssl = protocol.endswith("SSL")
    if not protocol.startswith("SASL"):
        return BaseSecurity(ssl_context=options.get("ssl_context"), use_ssl=True)
    kind = {"SCRAM-SHA-512": SASLScram512, "SCRAM-SHA-256": SASLScram256, "PLAIN": SASLPlaintext}
    if settings.kafka_sasl_mechanism not in kind:
        raise ValueError(f"unsupported WHETSTONE_KAFKA_SASL_MECHANISM {settings.kafka_sasl_mechanism!r}")
    if not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
        raise ValueError("WHETSTONE_KAFKA_SASL_USERNAME and WHETSTONE_KAFKA_SASL_PASSWORD are required with "
                         f"WHETSTONE_KAFKA_SECURITY_PROTOCOL={protocol}")
    return kind[settings.kafka_sasl_mechanism](settings.kafka_sasl_username, settings.kafka_sasl_password,
                                               ssl_context=options.get("ssl_context"), use_ssl=use_ssl)
