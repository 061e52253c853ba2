"""The blocking client, from a plain thread, against a real server."""

from __future__ import annotations

import asyncio

from tests.servers import ServeFactory
from wsserver.client import Audio, Done, SegmentEnd, SyncClient


async def test_the_blocking_client_streams_cancels_and_synthesizes(serve: ServeFactory) -> None:
    async with serve(max_patches=20) as running:

        def use() -> None:
            with SyncClient(running.ws_url) as client:
                assert client.hello["protocol"] == "ttsws/1"
                whole = client.synthesize("One call, all the audio. ", output={"format": "opus"})
                assert isinstance(whole.result, Done) and whole.sample_rate == 48000 and len(whole.pcm) > 0
                assert [s.text for s in whole.segments] == ["One call, all the audio. "]

                ctx = client.context(output={"format": "pcm_s16le", "sample_rate": 16000})
                ctx.append("Streamed in two pieces, ")
                ctx.append("then ended.")
                ctx.end()
                events = list(ctx)
                assert isinstance(events[-1], Done)
                assert sum(e.samples for e in events if isinstance(e, Audio)) == events[-1].audio_ms * 16
                assert (
                    "".join(e.text for e in events if isinstance(e, SegmentEnd))
                    == "Streamed in two pieces, then ended."
                )

                long = client.context(text="A long turn that the user interrupts after its first frame. ")
                long.end()
                first = next(long.audio())
                fence = long.cancel()
                assert fence.last_seq >= first.seq and list(long) == [fence]

        await asyncio.to_thread(use)
