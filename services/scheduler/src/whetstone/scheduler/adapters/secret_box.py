"""Webhook signing secrets, encrypted at rest.

A receiver verifies a delivery with the `whsec_...` secret it was shown once, so the platform must be
able to sign with that very secret: a hash cannot sign, and a derived key would change what every
receiver computes. The secret is therefore stored encrypted: AES-256-GCM under a key derived from
the platform's internal secret (`WHETSTONE_INTERNAL_SECRET`, held only by the gateway and the
scheduler), with the webhook's id as associated data, so a database dump or backup alone reveals
no secret and a sealed value copied onto another webhook's row does not open.

Stored form: `enc:v1:<urlsafe base64 of nonce (12 bytes) + ciphertext + tag>`. A value without the
prefix is a secret written before encryption; it still opens (as itself) until `reseal_legacy`
rewrites it, which the sender does when it starts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "enc:v1:"
_KEY_LABEL = b"whetstone:webhook-secrets:v1"


class SecretUnreadable(Exception):
    """A sealed secret that does not open with this platform's key (another key, or altered)."""


@dataclass(frozen=True)
class SecretBox:
    key: bytes

    @classmethod
    def from_internal_secret(cls, internal_secret: bytes) -> SecretBox:
        return cls(hmac.new(internal_secret, _KEY_LABEL, hashlib.sha256).digest())

    def seal(self, secret: str, webhook_id: str) -> str:
        nonce = os.urandom(12)
        sealed = AESGCM(self.key).encrypt(nonce, secret.encode(), webhook_id.encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, stored: str, webhook_id: str) -> str:
        if not stored.startswith(PREFIX):
            return stored          # written before encryption: resealed by `WebhookStore.reseal_legacy`
        try:
            raw = base64.urlsafe_b64decode(stored[len(PREFIX):])
            return AESGCM(self.key).decrypt(raw[:12], raw[12:], webhook_id.encode()).decode()
        except (InvalidTag, ValueError) as exc:   # altered, another key, or not base64 at all
            raise SecretUnreadable(f"webhook {webhook_id}: its secret does not open with this platform's key") from exc

    @staticmethod
    def sealed(stored: str) -> bool:
        return stored.startswith(PREFIX)
