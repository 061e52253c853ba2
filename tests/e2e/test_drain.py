"""SIGTERM: /ready turns 503, new sessions are refused, open contexts finish or are cancelled, close 4503, exit 0.

Runs `python -m wsserver` as a real process, the way it is deployed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.client import Client, http_get

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_sigterm_drains(tiny_checkpoint: Callable[..., Path]) -> None:
    port = free_port()
    args = [
        "--model",
        str(tiny_checkpoint("voxcpm2", stop=False)),
        "--device",
        "cpu",
        "--port",
        str(port),
        # The ended context needs well under a second of CPU; the drain timeout leaves it room on a loaded CI box.
        "--max-patches",
        "16",
        "--drain-timeout-s",
        "8",
    ]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wsserver", *args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    http, ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/tts/ws"
    try:
        for _ in range(600):
            await asyncio.sleep(0.1)
            try:
                if (await http_get(http + "/ready"))[0] == 200:
                    break
            except OSError:
                continue
        client = await Client.connect(ws)
        await client.send("context.create", ctx="finishing", text="This turn was ended and may finish. ")
        await client.send("context.end", ctx="finishing")
        await client.send("context.create", ctx="open", text="This one never gets its end, ")
        await client.until_message("segment.started", "finishing")

        process.send_signal(signal.SIGTERM)
        await client.until_message("warning")
        assert client.messages("warning")[0]["code"] == "draining"
        assert (await http_get(http + "/ready"))[0] == 503
        assert (await http_get(http + "/health"))[0] == 200
        with pytest.raises(InvalidStatus) as refused:
            await Client.connect(ws)
        assert refused.value.response.status_code == 503
        await client.send("context.create", ctx="late")
        assert (await client.until_message("error"))["code"] == "over_capacity"

        assert (await client.until_ended("finishing"))["type"] == "context.done"
        assert (await client.until_ended("open", timeout=20))["type"] == "context.cancelled"
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await client.next_event()
        assert closed.value.rcvd.code == 4503
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
