"""Guarantee 5 (limits are explicit) and malformed input: every refusal is an `error`, never a silent drop."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.client import Client
from tests.servers import ServeFactory


async def expect_error(client: Client, code: str, ctx: str | None = None) -> dict:
    error = await client.until_message("error")
    assert error["code"] == code, error
    assert error.get("ctx") == ctx
    assert error["fatal"] is False
    return error


async def test_malformed_messages_get_errors_and_the_session_lives_on(serve: ServeFactory) -> None:
    async with serve() as running:
        client = await Client.connect(running.ws_url)
        await client.ws.send("{nope")
        await expect_error(client, "bad_json")
        await client.ws.send("[1, 2]")
        await expect_error(client, "bad_message")
        await client.send("dance")
        await expect_error(client, "unknown_type")
        await client.send("text.append", ctx="a", text=["not", "a", "string"])
        await expect_error(client, "bad_message", "a")
        await client.send("text.append", ctx=7, text="x")
        await expect_error(client, "bad_message")
        await client.send("context.create", ctx="a", generation={"temperature": "hot"})
        await expect_error(client, "bad_message", "a")
        await client.send("context.create", ctx="a", generation={"seed": True})  # a bool is no integer
        await expect_error(client, "bad_message", "a")
        await client.send("context.create", ctx="a", buffering={"mode": "auto", "typo": 1})
        await expect_error(client, "bad_message", "a")
        await client.send("session.update", defaults={"generation": {"cfg_value": 99}})
        await expect_error(client, "bad_message")
        await client.ws.send(b"\x01\x02")  # binary from the client
        await expect_error(client, "bad_message")
        await client.send("context.flush", ctx="ghost")
        await expect_error(client, "unknown_ctx", "ghost")
        await client.send("context.end", ctx="ghost")
        await expect_error(client, "unknown_ctx", "ghost")
        await client.send("ping", t={"still": "alive"})
        assert (await client.until_message("pong"))["t"] == {"still": "alive"}
        await client.close()


async def test_formats_rates_and_voices_are_checked(serve: ServeFactory) -> None:
    async with serve() as running:
        client = await Client.connect(running.ws_url)
        for output in (
            {"format": "mp3"},
            {"format": "mulaw", "sample_rate": 16000},
            {"format": "pcm_s16le", "sample_rate": 44100},
            {"format": "opus", "sample_rate": 22050},
            {"format": "opus", "frame_ms": 25},
            {"format": "pcm_s16le", "frame_ms": 3},
        ):
            await client.send("context.create", ctx="c", output=output)
            error = await expect_error(client, "bad_format", "c")
            assert error["ended"] is True
        await client.send("session.update", defaults={"output": {"format": "flac"}})
        await expect_error(client, "bad_format")
        await client.send("context.create", ctx="c", voice="nobody")
        await expect_error(client, "bad_voice", "c")
        # a refused create leaves the id free
        await client.send("context.create", ctx="c", output={"format": "pcm_s16le", "sample_rate": 16000})
        created = await client.until_message("context.created", "c")
        assert created["output"] == {"format": "pcm_s16le", "sample_rate": 16000, "channels": 1, "frame_ms": 20}
        await client.send("context.create", ctx="c")
        error = await expect_error(client, "ctx_exists", "c")
        assert error["ended"] is False  # the live one goes on
        await client.send("context.cancel", ctx="c")
        await client.until_message("context.cancelled", "c")
        await client.send("context.create", ctx="c")  # ended ids are not reused
        await expect_error(client, "ctx_exists", "c")
        await client.send("text.append", ctx="c", text="more")
        await expect_error(client, "unknown_ctx", "c")
        await client.close()


async def test_too_many_contexts_and_text_too_long(serve: ServeFactory) -> None:
    async with serve(limits={"max_contexts": 2, "max_text_chars": 50}) as running:
        client = await Client.connect(running.ws_url)
        assert client.hello["limits"]["max_contexts"] == 2
        await client.send("context.create", ctx="a", buffering={"mode": "manual"})
        await client.send("text.append", ctx="b", text="hello ", flush=False)  # creates b with the defaults
        await client.until_message("context.created", "b")
        await client.send("context.create", ctx="c")
        error = await expect_error(client, "too_many_contexts", "c")
        assert error["ended"] is True
        await client.send("text.append", ctx="a", text="x" * 40)
        await client.send("text.append", ctx="a", text="y" * 11)  # 51 > 50: refused whole, a lives on
        error = await expect_error(client, "text_too_long", "a")
        assert error["ended"] is False
        await client.send("context.end", ctx="a")
        await client.send("context.cancel", ctx="b")
        assert (await client.until_ended("a"))["type"] == "context.done"
        [started] = client.messages("segment.started", "a")
        assert started["text"] == "x" * 40  # exactly the accepted text, nothing of the refused append
        await client.close()


async def test_oversize_message_is_refused_with_4413_and_huge_frames_with_1009(serve: ServeFactory) -> None:
    async with serve(limits={"max_message_bytes": 1000}) as running:
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="a", text="x" * 2000)
        error = await client.until_message("error")
        assert (error["code"], error["fatal"]) == ("bad_message", True)
        with pytest.raises(ConnectionClosed) as closed:
            await client.next_event()
        assert closed.value.rcvd.code == 4413
        client = await Client.connect(running.ws_url)
        await client.ws.send(orjson.dumps({"type": "ping", "t": "x" * 5000}).decode())  # over the WS layer's cap
        with pytest.raises(ConnectionClosed) as closed:
            await client.next_event()
        assert closed.value.rcvd.code == 1009


async def test_bad_request_loop_closes_4400(serve: ServeFactory) -> None:
    async with serve() as running:
        client = await Client.connect(running.ws_url)
        limit = client.hello["limits"]["max_bad_messages"]
        for _ in range(limit + 1):
            await client.ws.send("garbage")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await client.next_event()
        assert closed.value.rcvd.code == 4400
        assert client.messages("error")[-1]["fatal"] is True


async def test_rate_limit(serve: ServeFactory) -> None:
    async with serve(limits={"max_messages_per_s": 5, "max_bad_messages": 1000}) as running:
        client = await Client.connect(running.ws_url)
        for i in range(30):
            await client.send("ping", t=i)
        await client.until(lambda e: isinstance(e, dict) and e["type"] == "error" and e["code"] == "rate_limited")
        await client.close()


async def test_idle_timeout_closes_4408(serve: ServeFactory) -> None:
    async with serve(limits={"idle_timeout_s": 0.5}) as running:
        client = await Client.connect(running.ws_url)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await client.next_event(timeout=5)
        assert closed.value.rcvd.code == 4408
        assert client.messages("error")[-1]["code"] == "idle_timeout"


async def test_wrong_api_key_401_and_right_one_accepted(serve: ServeFactory) -> None:
    async with serve(api_key="s3cret") as running:
        for kwargs in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}}):
            with pytest.raises(InvalidStatus) as refused:
                await Client.connect(running.ws_url, **kwargs)
            assert refused.value.response.status_code == 401
        client = await Client.connect(running.ws_url, additional_headers={"Authorization": "Bearer s3cret"})
        await client.close()
        client = await Client.connect(running.ws_url + "?token=s3cret")
        await client.close()


async def test_over_max_connections_503_with_retry_after(serve: ServeFactory) -> None:
    async with serve(max_connections=2) as running:
        clients = [await Client.connect(running.ws_url) for _ in range(2)]
        with pytest.raises(InvalidStatus) as refused:
            await Client.connect(running.ws_url)
        assert refused.value.response.status_code == 503
        assert int(refused.value.response.headers["Retry-After"]) > 0
        await clients[0].close()
        await clients[0].ws.wait_closed()
        for _ in range(50):  # the slot frees once the server has seen the close
            if len(running.server.connections) < 2:
                break
            await asyncio.sleep(0.02)
        await (await Client.connect(running.ws_url)).close()
        await clients[1].close()
