"""Probes, /status, /metrics (parsed as Prometheus text) and the static web demo on the WebSocket port."""

from __future__ import annotations

import re

import orjson
import pytest
from websockets.exceptions import InvalidStatus

from tests.e2e.client import Client, http_get
from tests.servers import ServeFactory

# One sample line of the Prometheus text format 0.0.4: name, optional labels, a float value.
SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? (-?[0-9.e+-]+|[+-]Inf|NaN)$'
)


def parse_prometheus(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram")
            types[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        family = re.sub(r"_(bucket|sum|count)$", "", match.group(1))
        assert family in types or match.group(1) in types, line
        samples[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return samples


async def test_probes_status_and_metrics(serve: ServeFactory) -> None:
    async with serve(max_patches=3) as running:
        assert (await http_get(running.http_url + "/health"))[0] == 200
        assert (await http_get(running.http_url + "/ready"))[0] == 200
        client = await Client.connect(running.ws_url)
        await client.send("context.create", ctx="m", text="Measure me. ")
        await client.send("context.end", ctx="m")
        await client.until_ended("m")
        opus = {"format": "opus", "sample_rate": 48000}
        await client.send("context.create", ctx="o", output=opus, text="In Opus. ")
        await client.send("context.end", ctx="o")
        await client.until_ended("o")
        opus_frames = len(client.frames(client.messages("context.created", "o")[0]["handle"]))
        await client.ws.send("bad json")
        await client.until_message("error")

        status, _, body = await http_get(running.http_url + "/status")
        payload = orjson.loads(body)
        assert status == 200
        assert payload["connections"] == {"active": 1, "max": 256}
        assert payload["can_accept"] is True
        assert set(payload["engine"]) >= {"running", "waiting", "slots", "step_ms"}

        status, headers, body = await http_get(running.http_url + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        samples = parse_prometheus(body.decode())
        assert samples["ttsws_ttfa_seconds_count"] == 2
        assert samples['ttsws_ttfa_seconds_bucket{le="+Inf"}'] == 2
        assert samples["ttsws_rtf_count"] == 2
        assert samples['ttsws_errors_total{code="bad_json"}'] == 1
        assert samples['ttsws_contexts_total{outcome="done"}'] == 2
        # Every Opus frame sent was encoded and counted once, at the governor's start (6) or, once it measured room,
        # the ceiling (10): a test server's loop is far from busy.
        by_level = {k: v for k, v in samples.items() if k.startswith("ttsws_opus_frames_total")}
        assert set(by_level) <= {'ttsws_opus_frames_total{complexity="6"}', 'ttsws_opus_frames_total{complexity="10"}'}
        assert opus_frames > 0 and sum(by_level.values()) == opus_frames
        assert samples["ttsws_sessions_active"] == 1
        assert "ttsws_engine_step_seconds" in samples and "ttsws_engine_batch_size" in samples
        steps = samples["ttsws_engine_step_duration_seconds_count"]  # the warm-up's and this context's steps
        assert steps >= 3 and samples['ttsws_engine_step_duration_seconds_bucket{le="+Inf"}'] == steps
        await client.close()


async def test_web_demo_is_served_and_paths_stay_inside(serve: ServeFactory) -> None:
    async with serve() as running:
        status, headers, body = await http_get(running.http_url + "/")
        assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<" in body
        status, headers, _ = await http_get(running.http_url + "/app.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert (await http_get(running.http_url + "/../pyproject.toml"))[0] == 404
        assert (await http_get(running.http_url + "/%2e%2e/pyproject.toml"))[0] == 404
        assert (await http_get(running.http_url + "/nope.html"))[0] == 404


async def test_audio_frames_are_not_compressed(serve: ServeFactory) -> None:
    """The server declines permessage-deflate even when the client offers it (websockets' client does, as browsers
    do): compressing audio frames costs the event loop far more than it saves."""
    async with serve(max_patches=2) as running:
        client = await Client.connect(running.ws_url, compression="deflate")
        assert client.ws.protocol.extensions == []
        assert "Sec-WebSocket-Extensions" not in client.ws.response.headers
        await client.send("context.create", ctx="c", text="Plain frames. ")
        await client.send("context.end", ctx="c")
        await client.until_ended("c")


async def test_websocket_path_over_plain_http_answers_what_a_handshake_would_get(serve: ServeFactory) -> None:
    """Browsers hide a refused handshake's status; the web demo asks the same URL over plain HTTP instead."""
    async with serve(max_connections=1) as running:
        probe = running.http_url + "/v1/tts/ws"
        status, headers, body = await http_get(probe)
        assert status == 426 and headers["Upgrade"] == "websocket"
        client = await Client.connect(running.ws_url)
        status, headers, body = await http_get(probe)
        assert status == 503 and int(headers["Retry-After"]) > 0
        error = orjson.loads(body)["error"]
        assert error["code"] == "over_capacity" and "max_connections=1" in error["message"]
        await client.close()


async def test_websocket_upgrade_elsewhere_is_not_found(serve: ServeFactory) -> None:
    async with serve() as running:
        with pytest.raises(InvalidStatus) as refused:
            await Client.connect(running.ws_url.replace("/v1/tts/ws", "/v1/elsewhere"))
        assert refused.value.response.status_code == 404
        assert orjson.loads(refused.value.response.body)["error"]["code"] == "not_found"
