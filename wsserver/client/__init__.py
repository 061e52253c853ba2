"""The Python client of `ttsws/1` (docs/client.md): asyncio (`Client`) and blocking (`SyncClient`).

It imports neither torch nor the engine: `pip install voxstream` on a machine without a GPU is enough to use it.

    async with Client("ws://localhost:8000") as client:
        ctx = await client.context(output={"format": "opus", "sample_rate": 48000})
        await ctx.append("Hello there, how can I help?")
        await ctx.end()
        async for event in ctx:
            if isinstance(event, Audio):
                play(event.pcm)
"""

from wsserver.client.client import Client, websocket_url
from wsserver.client.context import Context, Synthesis
from wsserver.client.events import (
    Audio,
    Cancelled,
    ClientError,
    ConnectionLost,
    ContextFailed,
    Done,
    Event,
    Flushed,
    Notice,
    Packet,
    Queued,
    Refused,
    Rejected,
    SegmentEnd,
    SegmentStart,
    Unavailable,
)
from wsserver.client.sync import SyncClient, SyncContext

__all__ = [
    "Audio",
    "Cancelled",
    "Client",
    "ClientError",
    "ConnectionLost",
    "Context",
    "ContextFailed",
    "Done",
    "Event",
    "Flushed",
    "Notice",
    "Packet",
    "Queued",
    "Refused",
    "Rejected",
    "SegmentEnd",
    "SegmentStart",
    "SyncClient",
    "SyncContext",
    "Synthesis",
    "Unavailable",
    "websocket_url",
]
