"""Where the platform may connect on a tenant's behalf (a webhook's receiver, an image URL in a
training file or a chat request): a public address, or one the operator allow-listed. Pure
(`ipaddress` only, no sockets): the caller resolves the name, these rules judge every answer, and
the caller connects to the address `pin` chose (`Target.url_to`), never resolving the name again.

A host is read the way the C library would read it before it is judged: `127.1`, `0x7f000001`,
`2130706433` and `0177.0.0.1` are all 127.0.0.1 to `inet_aton`, so they are all loopback here. An
IPv6 address that carries an IPv4 one (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, 6to4,
Teredo, NAT64) is judged by the IPv4 address too."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NUMERIC_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_TOP_LABEL = re.compile(r"^(xn--[a-z0-9-]+|[a-z][a-z0-9-]*)$")
# names that only mean something inside a cluster, a LAN or this machine
LOCAL_SUFFIXES = (".localhost", ".local", ".localdomain", ".internal", ".intranet", ".lan", ".home", ".corp",
                  ".svc", ".cluster.local", ".home.arpa", ".arpa", ".invalid")
NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
SHARED = ipaddress.IPv4Network("100.64.0.0/10")   # carrier-grade NAT; often a cluster's pod network


class AddressError(ValueError):
    """`host` may not be reached: `reason` says why (shown to the tenant)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class AllowList:
    """The operator's exceptions (`WHETSTONE_SCHEDULER_WEBHOOK_ALLOW_HOSTS` for webhooks,
    `WHETSTONE_INGEST_IMAGE_FETCH_ALLOW_HOSTS` / `WHETSTONE_SERVING_IMAGE_FETCH_ALLOW_HOSTS` for image
    URLs): host names, addresses or networks (CIDR), each optionally with one port (`127.0.0.1:8123`,
    `[::1]:8123`, `hooks.corp.example:443`), that may be reached although they are not public (a test
    receiver on loopback). An entry with a port admits that port only."""

    hosts: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[Network, int | None], ...] = field(default=())

    @classmethod
    def parse(cls, entries: list[str] | tuple[str, ...]) -> AllowList:
        hosts, networks = set(), []
        for raw in entries:
            entry, port = raw.strip().lower(), None
            if entry.startswith("["):
                entry, _, rest = entry[1:].partition("]")
                port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
            elif entry.count(":") == 1:
                entry, _, number = entry.partition(":")
                port = int(number) if number.isdigit() else None
            if not entry:
                continue
            try:
                networks.append((ipaddress.ip_network(entry, strict=False), port))
            except ValueError:
                hosts.add((entry.rstrip("."), port))
        return cls(frozenset(hosts), tuple(networks))

    def admits(self, address: Address, port: int) -> bool:
        return any(address.version == n.version and address in n and p in (None, port) for n, p in self.networks)

    def names(self, host: str, port: int) -> bool:
        name = host.lower().rstrip(".")
        return (name, None) in self.hosts or (name, port) in self.hosts


def inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C library reads in a numeric `host` (1 to 4 parts, each decimal, octal
    with a leading 0 or hex with 0x; the last part fills the remaining bytes); None when `host` is
    not numeric. AddressError for a numeric host no resolver would accept (`256.1.1.1`, `09.1.1.1`)."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_PART.match(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2].lower() == "0x":
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p.startswith("0"):
            if set(p) - set("01234567"):
                raise AddressError(f"{host!r} is not a valid address")
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise AddressError(f"{host!r} is not a valid address")
    number = 0
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number | last)


def literal(host: str) -> Address | None:
    """The address written in `host` (IPv6 with or without brackets, or any IPv4 form), or None for a name."""
    bare = host.strip("[]")
    if ":" in bare:
        if "%" in bare:
            raise AddressError("an IPv6 address with a zone (%...) names a local interface")
        try:
            return ipaddress.IPv6Address(bare)
        except ValueError as exc:
            raise AddressError(f"{host!r} is not a valid IPv6 address") from exc
    return inet_aton(bare.rstrip("."))


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in n for n in NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if int(address) >> 32 == 0 and int(address) > 1:   # IPv4-compatible ::a.b.c.d (deprecated)
        return ipaddress.IPv4Address(int(address))
    return None


def kind(address: Address) -> str | None:
    """What makes `address` unreachable (loopback, private, ...), or None when it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None and (inner_kind := kind(inner)) is not None:
            return f"{inner_kind} (an IPv4 address inside IPv6)"
        if address.ipv4_mapped is not None:
            return "IPv4-mapped (give the IPv4 address itself)"
        if address.is_site_local:
            return "site-local"
    checks = (("unspecified", address.is_unspecified), ("loopback", address.is_loopback),
              ("link-local", address.is_link_local), ("multicast", address.is_multicast),
              ("private", address.is_private),
              ("shared (carrier-grade NAT or cluster)", isinstance(address, ipaddress.IPv4Address)
               and address in SHARED),
              ("reserved", address.is_reserved), ("not globally routable", not address.is_global))
    return next((name for name, hit in checks if hit), None)


def check_address(address: Address, port: int, allow: AllowList, who: str = "webhooks") -> None:
    """`who` names the caller in the refusal (`webhooks reach only public addresses`)."""
    if allow.admits(address, port):
        return
    if (why := kind(address)) is not None:
        raise AddressError(f"{address} is not public ({why}); {who} reach only public addresses")


def check_name(host: str, port: int, allow: AllowList) -> None:
    """A host name a public resolver can answer: two labels at least, no local or cluster suffix."""
    name = host.lower().rstrip(".")
    if allow.names(name, port):
        return
    if not name.isascii():
        raise AddressError(f"host {host!r} is not ASCII: give its punycode (xn--) form")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise AddressError(f"host {host!r} is not a valid host name")
    if len(labels) < 2 or name == "localhost" or not _TOP_LABEL.match(labels[-1]):
        raise AddressError(f"host {host!r} is not a public host name (a single label, or a numeric last label)")
    if any(name.endswith(suffix) for suffix in LOCAL_SUFFIXES):
        raise AddressError(f"host {host!r} names a local or cluster-internal host")


def check_host(host: str, port: int, allow: AllowList, who: str = "webhooks") -> Address | None:
    """Registration: the host as written. Its address when it is a literal (judged here), None for
    a name (judged here; its resolved addresses are judged by `pin`)."""
    address = literal(host)
    if address is None:
        check_name(host, port, allow)
        return None
    check_address(address, port, allow, who)
    return address


def pin(host: str, port: int, resolved: list[str], allow: AllowList, who: str = "webhooks") -> Address:
    """The address to connect to for `host`: every address the resolver gave must be allowed (one
    bad answer refuses the host, so a round-robin cannot smuggle one in); the first is used."""
    if not resolved:
        raise AddressError(f"host {host!r} did not resolve")
    addresses = []
    for text in resolved:
        try:
            addresses.append(ipaddress.ip_address(text.split("%")[0]))
        except ValueError as exc:
            raise AddressError(f"host {host!r} resolved to something that is not an address") from exc
    if allow.names(host, port):
        return addresses[0]
    for address in addresses:
        if allow.admits(address, port):
            continue
        if kind(address) is not None:
            raise AddressError(f"host {host!r} resolves to an address that is not public; "
                               f"{who} reach only public addresses")
    return addresses[0]


@dataclass(frozen=True)
class Target:
    """A checked http(s) URL. The caller connects to a pinned address (`url_to`) and names the
    host in the Host header (and TLS SNI) itself, so the name is resolved once per connection."""

    scheme: str
    host: str                    # as written, lower case, IPv6 without brackets
    port: int
    path: str                    # path and query
    address: Address | None      # the address a literal host names; None for a name

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"

    def url_to(self, address: Address) -> str:
        where = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
        return f"{self.scheme}://{where}:{self.port}{self.path}"
