"""Which service owns a public path. Pure."""

from __future__ import annotations

GATEWAY = "gateway"   # routes the gateway answers itself

# Longest prefix first; a prefix matches the path itself or the path followed by "/".
ROUTES: tuple[tuple[str, str], ...] = (
    ("/v1/fine_tuning", "scheduler"),
    ("/v1/keys", "scheduler"),
    ("/v1/templates", "scheduler"),
    ("/v1/webhooks", "scheduler"),
    ("/v1/operator/rate_limits", "gateway"),   # the tenant rates the gateway itself enforces
    ("/v1/operator", "scheduler"),
    ("/v1/files", "ingest"),
    ("/v1/base_models", "registry"),
    ("/v1/models", "registry"),
    ("/v1/chat/completions", "serving"),
    ("/v1/completions", "serving"),
    ("/v1/serving", "serving"),
    ("/v1/usage", "metering"),
)


def owner_of(path: str) -> str | None:
    """The service that owns `path`, or None (not a public route: /internal/* never is)."""
    if ".." in path or "//" in path:
        return None
    for prefix, service in ROUTES:
        if path == prefix or path.startswith(prefix + "/"):
            return service
    return None


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
