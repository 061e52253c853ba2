from __future__ import annotations

from wsserver.access import Caller, check_key, check_origin


def caller(origin: str | None = None, host: str = "tts.example:8000", token: str | None = None) -> Caller:
    return Caller("10.0.0.1", token, origin, host)


def test_origins() -> None:
    assert check_origin(caller(), (), keyed=True) is None  # no Origin: no browser page
    assert check_origin(caller("http://tts.example:8000"), (), keyed=True) is None  # the server's own pages
    assert check_origin(caller("http://localhost:3000"), (), keyed=False) is None  # a local page, keyless server
    assert check_origin(caller("http://localhost:3000"), (), keyed=True).status == 403
    assert check_origin(caller("https://app.example"), ("https://app.example",), keyed=True) is None
    assert (
        check_origin(caller("https://evil.example"), ("https://app.example",), keyed=False).code == "forbidden_origin"
    )
    assert check_origin(caller("https://evil.example"), ("*",), keyed=True) is None


def test_keys() -> None:
    assert check_key(caller(), None) is None
    assert check_key(caller(token="k"), "k") is None
    assert check_key(caller(token="K"), "k").status == 401
    assert check_key(caller(), "k").status == 401


def test_the_client_address_comes_from_a_trusted_proxy_only() -> None:
    headers = {"x-forwarded-for": "203.0.113.9, 198.51.100.7", "authorization": "Bearer k"}
    direct = Caller.of(headers, "", "192.0.2.1", trusted_proxies=("10.0.0.0/8",))
    assert direct.address == "192.0.2.1" and direct.token == "k"  # anyone can write the header: not believed
    proxied = Caller.of(headers, "token=q", "10.1.2.3", trusted_proxies=("10.0.0.0/8",))
    assert proxied.address == "198.51.100.7" and proxied.token == "k"  # what the proxy saw; the header wins
    assert Caller.of({}, "token=q", None).token == "q" and Caller.of({}, "", None).address == "unknown"
