"""PII and secret detection with checksums, and redaction. Pure.

Kinds: email, phone, credit_card (Luhn-checked), iban (mod-97 checked), ssn (US, with
the never-issued ranges excluded), ip_address (IPv4 octets <= 255, IPv6 parsed), secret
(cloud/API keys, tokens, private keys, `password = ...` style assignments).

Cheap prefilters keep clean text fast: the e-mail pattern only runs when the text has
an '@', the number patterns only when it has a digit, and the secret patterns only when
a known key prefix or keyword occurs. Number-shaped candidates are found with ONE scan
for runs of digits and separators and then classified on the (short) run.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

KINDS = ("email", "phone", "credit_card", "iban", "ssn", "ip_address", "secret")

_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])")
_NUMBER_RUN = re.compile(r"(?<![\w.])[+(]?\d[\d ().-]{5,60}\d\)?(?![\w])")
_SSN = re.compile(r"(?<!\d)(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)")
_IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])")
_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")
_PHONE = re.compile(
    r"(?<![\d+])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)|\d{1,4})(?:[ .-]?\d{2,4}){2,4}"   # international: +44 20 7946 0958
    r"|\(?\d{3}\)?[ .-]?\d{3}[ .-]\d{4}"                                # NANP: (555) 123-4567, 555.123.4567
    r"|0\d{2,4}[ .-]\d{3,4}[ .-]?\d{3,4}"                               # trunk prefix: 020 7946 0958
    r")(?!\d)")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?(?![A-Za-z0-9])")
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:.])")
# Secret tokens, one alternative per kind with the hints (substrings) any match of it contains. Each is
# written literal first, with its word boundary checked behind the literal (`xox(?<=\bxox)` matches
# exactly what `\bxox` does): a pattern that starts with `\b` cannot use the regex engine's fast
# search for a literal prefix, and scanned a text about 15x slower.
_SECRET_ALTERNATIVES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("AKIA", "ASIA"), r"A[KS]IA(?<=\bA[KS]IA)[0-9A-Z]{16}\b"),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh(?<=\bgh)[pousr]_[A-Za-z0-9]{36,255}\b"),
    (("github_pat_",), r"github_pat_(?<=\bgithub_pat_)[A-Za-z0-9_]{22,255}\b"),
    (("sk-",), r"sk-(?<=\bsk-)(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
    (("_live_",), r"[rs]k_live_(?<=\b[rs]k_live_)[A-Za-z0-9]{20,}"),
    (("xox",), r"xox(?<=\bxox)[abpr]-[A-Za-z0-9-]{10,}"),
    (("AIza",), r"AIza(?<=\bAIza)[0-9A-Za-z_-]{35}"),
    (("glpat-",), r"glpat-(?<=\bglpat-)[A-Za-z0-9_-]{20,}"),
    (("hf_",), r"hf_(?<=\bhf_)[A-Za-z]{30,}"),
    (("eyJ",), r"eyJ(?<=\beyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    (("-----BEGIN",), r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)
_SECRET_HINTS = tuple(h for hints, _ in _SECRET_ALTERNATIVES for h in hints)
# `password = "..."`-style assignments: a keyword, '=' or ':', then a value with letters AND digits
_ASSIGNMENT = re.compile(
    r"(?i)\b(?:api[_-]?key|secret(?:[_-]?key)?|access[_-]?token|auth[_-]?token|password|passwd)\b[\"']?\s*[:=]\s*[\"']?"
    r"(?=[A-Za-z0-9_\-/+=]{0,256}\d)(?=[A-Za-z0-9_\-/+=]{0,256}[A-Za-z])[A-Za-z0-9_\-/+=]{12,256}")
_ASSIGNMENT_WORDS = ("key", "secret", "token", "passw")
_DIGITS = "0123456789"
# Each hint contains its group's key character, the rarest of its characters in ordinary text (this
# order, rarest first): a text without the key cannot contain the hint, and one memchr-speed test of
# the key skips the whole group (scanning a text once per hint was the prefilter's main cost).
_RARITY = "_-JQZXKVYWUGBNFHMCDLPROIETSAzqjxkvybgpwfmucldrhsnioate"


def _hint_groups(hints: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    rank = {c: i for i, c in enumerate(_RARITY)}
    groups: dict[str, list[str]] = {}
    for h in hints:
        groups.setdefault(min(h, key=lambda c: rank.get(c, -1)), []).append(h)
    return tuple((key, tuple(hs)) for key, hs in groups.items())


_HINT_GROUPS = _hint_groups(_SECRET_HINTS)


def _has_hint(text: str) -> bool:
    """Whether any of `_SECRET_HINTS` occurs in `text`."""
    for key, hs in _HINT_GROUPS:
        if key in text:
            for h in hs:
                if h in text:
                    return True
    return False


@functools.lru_cache(maxsize=64)
def _secret_alternation(kinds: tuple[int, ...]) -> re.Pattern[str]:
    return re.compile("|".join(_SECRET_ALTERNATIVES[k][1] for k in kinds))


def _secret_token(text: str) -> re.Pattern[str]:
    """The secret alternatives whose hints occur in `text`, in order (the others cannot match in it: the
    matches are those of all of them); usually one kind, whose literal prefix the engine finds fast."""
    return _secret_alternation(tuple(k for k, (hints, _) in enumerate(_SECRET_ALTERNATIVES)
                                     if any(h in text for h in hints)))


def _has_digit(text: str) -> bool:
    for d in _DIGITS:
        if d in text:
            return True
    return False


@dataclass(frozen=True)
class PiiMatch:
    kind: str
    start: int
    end: int


def luhn_ok(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def iban_ok(candidate: str) -> bool:
    s = candidate.replace(" ", "")
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def _number_matches(text: str) -> list[PiiMatch]:
    found: list[PiiMatch] = []
    for run in _NUMBER_RUN.finditer(text):
        span, base = run.group(), run.start()
        taken: list[tuple[int, int]] = []
        for kind, pattern, check in (("ssn", _SSN, None), ("ip_address", _IPV4, None),
                                     ("credit_card", _CARD, luhn_ok), ("phone", _PHONE, None)):
            for m in pattern.finditer(span):
                if any(m.start() < e and s < m.end() for s, e in taken):
                    continue
                if check is None or check(m.group()):
                    taken.append((m.start(), m.end()))
                    found.append(PiiMatch(kind, base + m.start(), base + m.end()))
    return found


def _email_matches(text: str) -> list[PiiMatch]:
    """E-mail addresses, searched only in windows around the '@'s (merged: linear in the text)."""
    windows: list[list[int]] = []
    at = text.find("@")
    while at >= 0:
        lo, hi = max(0, at - 65), min(len(text), at + 320)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = hi
        else:
            windows.append([lo, hi])
        at = text.find("@", at + 1)
    return [PiiMatch("email", m.start(), m.end()) for lo, hi in windows for m in _EMAIL.finditer(text, lo, hi)]


def _ipv6_matches(text: str) -> list[PiiMatch]:
    out = []
    for m in _IPV6.finditer(text):
        if sum(1 for group in m.group().split(":") if group) < 3:
            continue  # "a::b" is C++, not an address
        try:
            ipaddress.IPv6Address(m.group())
        except ValueError:
            continue
        out.append(PiiMatch("ip_address", m.start(), m.end()))
    return out


def might_contain(text: str) -> bool:
    """False when `text` certainly holds no PII (the prefilters of `scan`, on a whole row at once)."""
    return ("@" in text or _has_digit(text) or "::" in text or text.count(":") >= 5 or _has_hint(text))


def scan(text: str) -> list[PiiMatch]:
    """All PII in `text`, sorted, non-overlapping (the earlier, then longer match wins)."""
    found: list[PiiMatch] = []
    if "@" in text:
        found += _email_matches(text)
    if _has_digit(text):
        found += _number_matches(text)
        found += [PiiMatch("iban", m.start(), m.end()) for m in _IBAN.finditer(text) if iban_ok(m.group())]
    if "::" in text or text.count(":") >= 5:
        found += _ipv6_matches(text)
    if _has_hint(text):
        found += [PiiMatch("secret", m.start(), m.end()) for m in _secret_token(text).finditer(text)]
    if ("=" in text or ":" in text) and any(w in text.lower() for w in _ASSIGNMENT_WORDS):
        found += [PiiMatch("secret", m.start(), m.end()) for m in _ASSIGNMENT.finditer(text)]
    found.sort(key=lambda m: (m.start, -m.end))
    kept: list[PiiMatch] = []
    for m in found:
        if not kept or m.start >= kept[-1].end:
            kept.append(m)
    return kept


def redact(text: str, matches: list[PiiMatch]) -> str:
    """Replace every match with a placeholder such as [EMAIL] or [CREDIT_CARD]."""
    out, pos = [], 0
    for m in matches:
        out.append(text[pos:m.start])
        out.append(f"[{m.kind.upper()}]")
        pos = m.end
    out.append(text[pos:])
    return "".join(out)
