"""`python -m wsserver`: serve ttsws/1 and the HTTP API until SIGTERM or SIGINT, then drain.

With worker processes (the default: `--workers` from the cores) the supervisor runs engine processes and workers
(wsserver.supervisor); `--workers 0` serves from this one process, the engine on a thread beside the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import uvloop

from wsserver.config import ServerConfig, parse_args, resolve_model
from wsserver.loras import resolve_start_loras
from wsserver.server import TTSServer
from wsserver.supervisor import supervise
from wsserver.voices import open_voices

logger = logging.getLogger("wsserver")


async def serve_in_process(config: ServerConfig) -> None:
    from engine import AsyncEngine  # torch and the model code: only where the engine runs

    server = TTSServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Listen first, so probes see /health 200 and /ready 503 while the model loads.
    await server.listen()
    logger.info("listening on %s:%d", config.bind_host, config.port)
    [device] = config.engine_devices()  # one process serves one engine
    engine_config = config.engine_config(
        await asyncio.to_thread(resolve_model, config),
        device.device if device.gpu is None else f"cuda:{device.gpu}",
        await asyncio.to_thread(resolve_start_loras, config),
    )
    engine = await asyncio.to_thread(AsyncEngine, engine_config)
    await engine.start()
    server.attach([engine], await open_voices(engine, config))
    # Everything made so far (torch, the model, the libraries) lives as long as the process: keep it out of the
    # collector's scans. A full collection over it took ~150 ms, every thread stopped, whenever a burst of sessions
    # allocated enough to trigger one.
    gc.collect()
    gc.freeze()
    logger.info("ready: model %s at %d Hz", engine.info.name, engine.info.sample_rate)
    await stop.wait()
    logger.info("draining")
    await server.drain()
    await engine.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # one line per probe and per connection is noise
    config = parse_args()
    if config.worker_count() == 0:
        if len(config.engine_devices()) > 1:
            raise SystemExit("--workers 0 serves one engine: give one device, or worker processes")
        uvloop.run(serve_in_process(config))
    else:
        uvloop.run(supervise(config))
