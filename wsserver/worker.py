"""A front-end worker process: HTTP and WebSocket sessions on the connections the supervisor deals it (accepted on
the server's port, passed over its channel: wsserver.handoff), audio framed and encoded here (Opus, resampling,
mu-law), engines reached over Unix sockets, seats and slots from the supervisor's coordinator (docs/architecture in
wsserver.supervisor). It never loads torch: that is the engine processes' affair.

It serves at once (so /health answers and /ready says "starting" while the engines load), connects to the
coordinator, then to every engine as it comes up, then serves. SIGTERM drains it (docs/protocol.md); so does the
loss of the coordinator, since nothing new can start without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket

import uvloop

from engine import EngineError
from engine.client import EngineClient
from wsserver.config import ServerConfig
from wsserver.link import RemoteLink
from wsserver.server import TTSServer
from wsserver.voices import open_voices

logger = logging.getLogger("wsserver.worker")

CONNECT_EVERY_S = 0.2  # while an engine process is still loading its model


def run(
    config: ServerConfig, channel: socket.socket, coordinator_path: str, engine_paths: list[str], index: int
) -> None:
    """The worker process (a multiprocessing spawn target)."""
    tag = f"worker-{index}[{os.getpid()}]"
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {tag} %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides (a ^C reaches the whole process group)
    uvloop.run(serve(config, channel, coordinator_path, engine_paths))


async def serve(config: ServerConfig, channel: socket.socket, coordinator_path: str, engine_paths: list[str]) -> None:
    server = TTSServer(config)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    link = await RemoteLink.connect(coordinator_path, server.report)
    server.link = link
    await server.serve_dealt(channel)
    engines = await _connect(engine_paths, config, link)
    if engines is not None:
        server.attach(engines, await open_voices(engines[0], config), link)
        # The startup heap lives as long as the process: keep it out of the collector's scans (wsserver.__main__).
        gc.collect()
        gc.freeze()
        logger.info("serving with %d engine(s)", len(engines))
    waits = [asyncio.ensure_future(stop.wait()), link.lost]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    waits[0].cancel()
    logger.info("draining")
    await server.drain()
    for engine in engines or []:
        await engine.close()
    await link.close()


async def _connect(paths: list[str], config: ServerConfig, link: RemoteLink) -> list[EngineClient] | None:
    """A client for every engine, once each listens; None if the server stops first."""
    engines = []
    for path in paths:
        while True:
            if link.lost.done() or link.draining:
                return None
            with contextlib.suppress(EngineError):
                engines.append(await EngineClient.connect(path))
                break
            await asyncio.sleep(CONNECT_EVERY_S)
    return engines
