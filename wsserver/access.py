"""Who may use the server: the API and admin keys, the origins a browser page may call from, and what identifies a
client for the per-client limits (docs/security.md). Sans-I/O: the adapters hand in what a request says.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from wsserver.http import ApiError

_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


@dataclass(frozen=True, slots=True)
class Caller:
    """What a request says about who sends it."""

    address: str  # the client's IP: the peer's, or what a trusted proxy forwarded
    token: str | None  # `Authorization: Bearer KEY`, else ?token=KEY
    origin: str | None  # the Origin header: browsers send it, other clients usually not
    host: str | None  # the Host header

    @classmethod
    def of(
        cls, headers: Mapping[str, str], query: str, peer: str | None, trusted_proxies: tuple[str, ...] = ()
    ) -> Caller:
        header = headers.get("authorization") or ""
        token = header[7:] if header.startswith("Bearer ") else (parse_qs(query).get("token") or [None])[0]
        address = peer or "unknown"
        forwarded = headers.get("x-forwarded-for")
        if forwarded and _trusted(address, trusted_proxies):
            address = forwarded.split(",")[-1].strip() or address  # the address the proxy itself saw
        return cls(address, token, headers.get("origin"), headers.get("host"))


def check_key(caller: Caller, key: str | None, what: str = "this server") -> ApiError | None:
    """401 unless the caller presents `key` (no key: nothing to check)."""
    if key is None or (caller.token is not None and hmac.compare_digest(caller.token.encode(), key.encode())):
        return None
    return ApiError(401, "unauthorized", f"{what} needs Authorization: Bearer KEY (or ?token=KEY)")


def check_origin(caller: Caller, allowed: tuple[str, ...], keyed: bool) -> ApiError | None:
    """403 for a browser page of another origin: only the server's own pages, the `allowed` origins (`*`: any) and,
    on a server without a key, pages served from this machine may open sessions or call the API. A request without
    an Origin header is no browser page's, and passes (the key, if any, guards it)."""
    if caller.origin is None or "*" in allowed or caller.origin in allowed:
        return None
    origin = urlsplit(caller.origin)
    if caller.host is not None and origin.netloc.lower() == caller.host.lower():
        return None  # same origin: the web demo, or a page this server serves
    if not keyed and (origin.hostname or "") in _LOCAL_HOSTS:
        return None
    return ApiError(403, "forbidden_origin", f"pages of {caller.origin} may not use this server (--allowed-origins)")


def _trusted(address: str, proxies: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(proxy, strict=False) for proxy in proxies)
