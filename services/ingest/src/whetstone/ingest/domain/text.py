"""Text normalization, exact-duplicate digests and the deterministic split. Pure."""

from __future__ import annotations

import hashlib
import unicodedata

from .jsontypes import JsonObject

# the ASCII characters str.split() separates on, each mapped to a space
_ASCII_SPACES = bytes.maketrans(b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f", b" " * 9)


def normalize_text(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed: what 'the same text' means for dedup."""
    if text.isascii():
        # most text has no run of whitespace to collapse: one translation, no split into words
        flat = text.lower().encode("ascii").translate(_ASCII_SPACES)
        if b"  " not in flat and not flat.startswith(b" ") and not flat.endswith(b" "):
            return flat.decode("ascii")
    else:
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.lower().split())


def fingerprint(messages: list[JsonObject]) -> tuple[str, bytes]:
    """(normalized text of all contents, SHA-256 of the normalized role-keyed contents).

    Equal digests = exact duplicates: the same roles with the same text up to case,
    whitespace and Unicode compatibility forms."""
    norms = [normalize_text(m["content"]) for m in messages]
    keyed = "\x1e".join([f"{m['role']}\x1f{n}" for m, n in zip(messages, norms)])
    return " ".join(norms), hashlib.sha256(keyed.encode("utf-8", "surrogatepass")).digest()


def digest_key(digest: bytes) -> int:
    """64-bit key of a digest for the compact duplicate set (never 0)."""
    return int.from_bytes(digest[:8], "little") or 1


def in_validation_split(digest: bytes, fraction: float) -> bool:
    """Deterministic split by content: the same example always lands on the same side."""
    return int.from_bytes(digest[8:12], "big") / 0xFFFFFFFF < fraction
