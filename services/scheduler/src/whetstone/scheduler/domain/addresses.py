"""Where a tenant's webhook may point: the shared address rules of `whetstone.runtime.addresses`
(ingest and serving judge image URLs with the same rules)."""

from whetstone.runtime.addresses import (
    LOCAL_SUFFIXES,
    NAT64,
    SHARED,
    Address,
    AddressError,
    AllowList,
    Network,
    check_address,
    check_host,
    check_name,
    embedded_ipv4,
    inet_aton,
    kind,
    literal,
    pin,
)

__all__ = ["LOCAL_SUFFIXES", "NAT64", "SHARED", "Address", "AddressError", "AllowList", "Network", "check_address",
           "check_host", "check_name", "embedded_ipv4", "inet_aton", "kind", "literal", "pin"]
