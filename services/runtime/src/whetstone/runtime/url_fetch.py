"""Fetching one http(s) URL on a tenant's behalf (an image URL in a training file or a chat request),
where the operator allows it. The URL's host is judged by `addresses` as a webhook's is: a literal
address as written (every `inet_aton` form, IPv4 inside IPv6), a name by EVERY address it resolves
to; the connection then goes to the address that was judged (`Target.url_to`, the name in the Host
header and the TLS SNI), so a name that resolves elsewhere a moment later is never asked again.
Redirects are never followed (a redirect could point anywhere). The body is capped in bytes (a
Content-Length over the cap is refused before reading, a longer stream is cut; a compressed answer
is refused, so the cap holds on what is stored) and the whole fetch,
resolution included, in time. A refusal is a `FetchRefused` whose reason names no address a name
resolved to."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from .addresses import AddressError, AllowList, Target, check_host, pin

Resolve = Callable[[str, int], list[str]]      # (host, port) -> the addresses it resolves to
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="url-fetch-resolve")


class FetchRefused(Exception):
    """The URL was not fetched (or its answer was not taken): `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FetchPolicy:
    """The operator's setting: `allow` lists the hosts that may be reached although they are not
    public (a test server on loopback); every other host must be public."""

    allow: AllowList = field(default_factory=AllowList)
    max_bytes: int = 10 * 1024 ** 2
    timeout_s: float = 10.0
    who: str = "image URLs"            # names the caller in a refusal ("image URLs reach only public addresses")


@dataclass(frozen=True)
class Fetched:
    data: bytes
    media_type: str                    # the answer's Content-Type without parameters, lower case ("" if none)


def system_resolve(host: str, port: int) -> list[str]:
    return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))


def check_target(url: str, policy: FetchPolicy) -> Target:
    """The URL's form and its host as written (a literal address is judged here)."""
    if len(url) > 2048:
        raise FetchRefused("the URL is longer than 2048 characters")
    if not url.isascii() or any(c.isspace() or ord(c) < 32 for c in url):
        raise FetchRefused("the URL must be ASCII without spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchRefused("the URL must be http:// or https://")
    if not parts.hostname:
        raise FetchRefused("the URL has no host")
    if parts.username or parts.password or "@" in parts.netloc:
        raise FetchRefused("the URL must not carry credentials")
    if "%" in parts.netloc or "\\" in url:
        raise FetchRefused("the host must not be percent-encoded or hold a backslash")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise FetchRefused("the URL has an invalid port") from exc
    try:
        address = check_host(parts.hostname, port, policy.allow, policy.who)
    except AddressError as exc:
        raise FetchRefused(exc.reason) from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname.lower(), port, path, address)


def fetch(url: str, policy: FetchPolicy, resolve: Resolve = system_resolve,
          transport: httpx.BaseTransport | None = None) -> Fetched:
    """GET `url` under `policy`: its body and media type, or FetchRefused."""
    deadline = time.monotonic() + policy.timeout_s
    target = check_target(url, policy)
    address = target.address
    if address is None:
        try:
            resolved = _RESOLVER.submit(resolve, target.host, target.port).result(timeout=policy.timeout_s)
        except (OSError, FutureTimeout) as exc:
            raise FetchRefused(f"host {target.host!r} could not be resolved") from exc
        try:
            address = pin(target.host, target.port, resolved, policy.allow, policy.who)
        except AddressError as exc:
            raise FetchRefused(exc.reason) from exc
    left = max(0.1, deadline - time.monotonic())
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    headers = {"Host": target.host_header, "User-Agent": "whetstone-fetch/1", "Accept": "image/*",
               "Accept-Encoding": "identity"}
    try:
        with httpx.Client(follow_redirects=False, trust_env=False, transport=transport,
                          timeout=httpx.Timeout(left, connect=min(left, 5.0))) as http, \
                http.stream("GET", target.url_to(address), headers=headers, extensions=extensions) as resp:
            if 300 <= resp.status_code < 400:
                raise FetchRefused(f"HTTP {resp.status_code}: redirects are not followed")
            if not 200 <= resp.status_code < 300:
                raise FetchRefused(f"HTTP {resp.status_code}")
            if resp.headers.get("content-encoding", "identity").lower() != "identity":
                raise FetchRefused("the answer is compressed (Content-Encoding); send the image as it is")
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > policy.max_bytes:
                raise FetchRefused(f"the answer is {int(declared):,} bytes; at most {policy.max_bytes:,}")
            body = bytearray()
            for chunk in resp.iter_raw():
                body += chunk
                if len(body) > policy.max_bytes:
                    raise FetchRefused(f"the answer is over {policy.max_bytes:,} bytes")
                if time.monotonic() > deadline:
                    raise FetchRefused(f"no complete answer within {policy.timeout_s:g} s")
            media = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    except httpx.TimeoutException as exc:
        raise FetchRefused(f"no complete answer within {policy.timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise FetchRefused(f"the connection failed ({type(exc).__name__})") from exc
    return Fetched(bytes(body), media)


def fetch_port(policy: FetchPolicy, resolve: Resolve = system_resolve) -> Callable[[str], tuple[bytes, str] | str]:
    """`fetch` as the image reader's port (`modelkit.image_rules.FetchImage`): (bytes, media type), or the
    reason it was not fetched."""
    def get(url: str) -> tuple[bytes, str] | str:
        try:
            got = fetch(url, policy, resolve)
        except FetchRefused as exc:
            return exc.reason
        return got.data, got.media_type

    return get
