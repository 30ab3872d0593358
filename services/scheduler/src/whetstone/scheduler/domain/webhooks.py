"""Tenant webhooks, pure: which URLs and event types are allowed, the signature a receiver checks,
and when a failed delivery is tried again. Where a URL may point is `addresses`' rule; a checked URL
is an `addresses.Target` (the sender connects to its pinned address)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from whetstone.runtime.addresses import AddressError, AllowList, Target, check_host

__all__ = ["Target", "WebhookError", "check_url", "check_events", "sign", "verify", "next_delay_s", "outcome",
           "status_class"]

EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled", "model.registered", "model.promoted")
SIGNATURE_HEADER = "Whetstone-Signature"
EVENT_ID_HEADER = "Whetstone-Event-Id"
EVENT_TYPE_HEADER = "Whetstone-Event-Type"


class WebhookError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


def check_url(url: str, allow: AllowList = AllowList()) -> Target:
    """The URL's form and its host as written (a literal address is judged here; a name's resolved
    addresses are judged by `addresses.pin` at registration and again at each delivery)."""
    if len(url) > 2048:
        raise WebhookError("url", "longer than 2048 characters")
    if not url.isascii() or any(c.isspace() or ord(c) < 32 for c in url):
        raise WebhookError("url", "must be ASCII without spaces or control characters (punycode a name)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookError("url", "must be an http:// or https:// URL")
    if not parts.hostname:
        raise WebhookError("url", "has no host")
    if parts.username or parts.password or "@" in parts.netloc:
        raise WebhookError("url", "must not carry credentials (the signature authenticates the platform)")
    if "%" in parts.netloc or "\\" in url:
        raise WebhookError("url", "the host must not be percent-encoded or hold a backslash")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise WebhookError("url", "has an invalid port") from exc
    try:
        address = check_host(parts.hostname, port, allow)
    except AddressError as exc:
        raise WebhookError("url", exc.reason) from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname.lower(), port, path, address)


def status_class(code: int | None) -> str:
    """All a tenant learns of a receiver's answer besides its code: `HTTP 2xx` .. `HTTP 5xx`."""
    return f"HTTP {code // 100}xx" if code is not None and 100 <= code < 600 else "HTTP ?"


def check_events(events: list[str]) -> list[str]:
    """An empty filter means every event type."""
    for i, e in enumerate(events):
        if e not in EVENT_TYPES:
            raise WebhookError(f"events.{i}", f"unknown event type {e!r} (known: {', '.join(EVENT_TYPES)})")
    return sorted(set(events))


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """`t=<unix>,v1=<hex hmac-sha256(secret, "<t>.<body>")>`: the receiver recomputes it and checks `t` is recent."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclass(frozen=True)
class Signature:
    """A signature header's parts: `t` (digits) and `v1` (the hex MAC)."""
    t: str
    v1: str

    @classmethod
    def parse(cls, header: str) -> Signature | None:
        """None unless the header has a numeric `t` and a `v1` (a part given twice: the last one)."""
        t = v1 = None
        for name, _, value in (part.partition("=") for part in header.split(",") if "=" in part):
            if name == "t":
                t = value
            elif name == "v1":
                v1 = value
        return cls(t, v1) if t is not None and t.isdigit() and v1 is not None else None


def verify(secret: str, header: str, body: bytes) -> bool:
    given = Signature.parse(header)
    if given is None:
        return False
    return hmac.compare_digest(sign(secret, int(given.t), body), f"t={given.t},v1={given.v1}")


def next_delay_s(attempts: int, base_s: float, cap_s: float = 3600.0) -> float:
    """Exponential backoff after the n-th failed attempt: base, 4x base, 16x base, ... (capped)."""
    return min(cap_s, base_s * 4.0 ** max(0, attempts - 1))


def outcome(status_code: int | None, attempts: int, max_attempts: int) -> str:
    """'succeeded' on a 2xx; 'failed' once the attempts are spent; else 'pending' (tried again)."""
    if status_code is not None and 200 <= status_code < 300:
        return "succeeded"
    return "failed" if attempts >= max_attempts else "pending"
