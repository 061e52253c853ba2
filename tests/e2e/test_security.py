"""Defences (docs/security.md): browser origins, the admin key, per-client limits, and no secret in the logs."""

from __future__ import annotations

import logging

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.e2e.client import Client
from tests.e2e.test_voices_api import clip
from tests.servers import ServeFactory


async def refused(url: str, **kwargs: object) -> int:
    with pytest.raises(InvalidStatus) as error:
        await Client.connect(url, **kwargs)
    return error.value.response.status_code


async def test_pages_of_other_origins_are_refused(serve: ServeFactory) -> None:
    async with serve() as running:  # no key: its own pages and this machine's
        host = running.http_url.removeprefix("http://")
        assert await refused(running.ws_url, origin="https://evil.example") == 403
        for origin in (f"http://{host}", "http://localhost:5173", None):
            client = await Client.connect(running.ws_url, origin=origin)
            await client.close()
        async with httpx.AsyncClient(base_url=running.http_url) as http:
            evil = {"Origin": "https://evil.example"}
            upload = await http.post("/v1/voices", headers=evil, files={"audio": ("a.wav", clip())}, data={"name": "x"})
            assert upload.status_code == 403 and upload.json()["error"]["code"] == "forbidden_origin"
            assert (
                await http.post("/v1/audio/speech", headers=evil, json={"input": "Hi", "voice": "default"})
            ).status_code == 403
            assert (await http.get("/health", headers=evil)).status_code == 200  # probes are no page's business


async def test_a_keyed_server_takes_only_the_origins_it_names(serve: ServeFactory) -> None:
    async with serve(api_key="k", allowed_origins=("https://app.example",)) as running:
        url = running.ws_url + "?token=k"
        assert await refused(url, origin="http://localhost:5173") == 403  # with a key, localhost is no exception
        assert await refused(url, origin="https://evil.example") == 403
        for origin in ("https://app.example", None):
            client = await Client.connect(url, origin=origin)
            await client.close()


async def test_voices_change_only_with_the_admin_key(serve: ServeFactory) -> None:
    async with (
        serve(api_key="user", admin_key="admin") as running,
        httpx.AsyncClient(base_url=running.http_url) as http,
    ):
        user, admin = {"Authorization": "Bearer user"}, {"Authorization": "Bearer admin"}
        form = {"files": {"audio": ("a.wav", clip())}, "data": {"name": "A", "transcript": "Hello there."}}
        denied = await http.post("/v1/voices", headers=user, **form)
        assert denied.status_code == 401 and "voices" in denied.json()["error"]["message"]
        created = await http.post("/v1/voices", headers=admin, **form)
        assert created.status_code == 201
        voice = created.json()["id"]
        assert (await http.get("/v1/voices", headers=user)).status_code == 200  # reading needs only the API key
        speech = await http.post(
            "/v1/audio/speech", headers=user, json={"input": "Hi.", "voice": voice, "stream": False}
        )
        assert speech.status_code == 200
        assert (await http.delete(f"/v1/voices/{voice}", headers=user)).status_code == 401
        assert (await http.delete(f"/v1/voices/{voice}", headers=admin)).status_code == 200


async def test_one_client_cannot_take_every_seat_or_flood_the_handshakes(serve: ServeFactory) -> None:
    async with serve(max_connections_per_client=2) as running:
        first, second = await Client.connect(running.ws_url), await Client.connect(running.ws_url)
        assert await refused(running.ws_url) == 429
        async with httpx.AsyncClient(base_url=running.http_url) as http:
            busy = await http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "default"})
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "too_many_connections"
        await first.close()
        third = await Client.connect(running.ws_url)  # a seat came back
        await second.close()
        await third.close()
    async with serve(handshakes_per_client_s=1.0) as running:  # a burst of two, then one a second
        clients = [await Client.connect(running.ws_url) for _ in range(2)]
        with pytest.raises(InvalidStatus) as error:
            await Client.connect(running.ws_url)
        assert error.value.response.status_code == 429 and error.value.response.headers["Retry-After"] == "1"
        for client in clients:
            await client.close()


async def test_keys_never_reach_the_logs(serve: ServeFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Not even at DEBUG, where websockets logs each handshake's request line (its path carries ?token=KEY)."""
    caplog.set_level(logging.DEBUG)
    async with serve(api_key="s3cret-api", admin_key="s3cret-admin") as running:
        client = await Client.connect(running.ws_url + "?token=s3cret-api")
        await client.send("context.create", ctx="c", text="Hello. ")
        await client.send("context.end", ctx="c")
        await client.until_ended("c")
        await client.close()
        assert await refused(running.ws_url + "?token=wrong-s3cret") == 401
        async with httpx.AsyncClient(base_url=running.http_url) as http:
            await http.get("/v1/voices?token=s3cret-admin")
            await http.post("/v1/audio/speech", headers={"Authorization": "Bearer s3cret-api"}, json={"input": "x"})
    server = [r for r in caplog.records if not r.name.startswith(("websockets.client", "httpx", "httpcore"))]
    assert server and not [r.getMessage() for r in server if "s3cret" in r.getMessage()]
