"""LiveKit Agents: a `tts.TTS` plugin with streaming on one voxstream session (`pip install "voxstream[livekit]"`).

Every `SynthesizeStream` (one per agent reply) is one `ttsws/1` context on the plugin's single session: pushed text is
appended as it comes, `flush()` flushes, `end_input()` ends the context, and `aclose()` (how LiveKit interrupts)
cancels it on the server, whose engine work stops, while the session stays open for the next reply. Frames are routed
by context on the client side, so a stream never sees audio of another, including an interrupted one's.

Audio arrives as 16-bit PCM at the plugin's sample rate (8, 16, 24 or 48 kHz, or the model's own rate). The aligned
transcript is per segment: one `TimedString` for each segment's text with the start and end of its audio, which is
all the timing the model gives (docs/client.md says why there is no word timing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, TimedString

from wsserver.client import (
    Audio,
    Client,
    ClientError,
    Context,
    ContextFailed,
    Refused,
    Rejected,
    SegmentEnd,
)

logger = logging.getLogger(__name__)

# Codes of a context refused for what it asked (retrying the same request cannot help), as opposed to a server that
# was busy or failed.
_CLIENT_FAULTS = {
    "bad_message",
    "bad_format",
    "bad_voice",
    "bad_lora",
    "unsupported",
    "text_too_long",
    "too_many_contexts",
    "unauthorized",
}


class TTS(tts.TTS):
    """Streaming TTS on a voxstream server.

    Args:
        url: the server, `ws://host:8000` (or the full `/v1/tts/ws` URL).
        api_key: the server's `--api-key`, if it has one.
        voice: a name from the server's voices (`hello.voices`).
        sample_rate: the output rate.
        lora: a LoRA adapter loaded on the server (`hello.loras.loaded`).
        instruction: how to speak, for a model that takes instructions (`hello.model.instruction`, Qwen3-TTS).
        language: one of `hello.model.languages`, in the model's spelling (e.g. "english").
        generation: the protocol's generation settings, e.g. `{"cfg_value": 2.0, "inference_timesteps": 10}`.
        buffering: the protocol's buffering settings (how the server cuts text into segments).

    `lora`, `instruction` and `language` go with every stream's context (None: not sent, the server's default); a
    server that cannot honour one refuses the stream with an `APIStatusError` (400, `bad_lora`, `unsupported`).
    """

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None = None,
        voice: str = "default",
        sample_rate: int = 24000,
        lora: str | None = None,
        instruction: str | None = None,
        language: str | None = None,
        generation: Mapping[str, Any] | None = None,
        buffering: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._client = Client(url, api_key=api_key)
        self._settings: dict[str, Any] = {
            "voice": voice,
            "lora": lora,
            "instruction": instruction,
            "language": language,
            "output": {"format": "pcm_s16le", "sample_rate": sample_rate},
            "generation": generation,
            "buffering": buffering,
        }
        self._streams: set[SynthesizeStream] = set()
        self._prewarm: asyncio.Task[Any] | None = None

    @property
    def model(self) -> str:
        try:
            return str(self._client.hello["model"]["name"])
        except RuntimeError:  # not connected yet
            return "unknown"

    @property
    def provider(self) -> str:
        return "voxstream"

    def prewarm(self) -> None:
        """Open the session now, so the first reply does not wait for the handshake."""
        if self._prewarm is None:
            self._prewarm = asyncio.create_task(self._client.connect())

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        if self._prewarm is not None:
            await asyncio.gather(self._prewarm, return_exceptions=True)
        await self._client.close()

    async def open_context(self) -> Context:
        try:
            return await self._client.context(**self._settings)
        except ClientError as error:
            raise _api_error(error) from error


class SynthesizeStream(tts.SynthesizeStream):
    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._voxstream = tts

    async def aclose(self) -> None:
        await super().aclose()
        self._voxstream._streams.discard(self)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._voxstream.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        context = await self._voxstream.open_context()
        output_emitter.start_segment(segment_id=context.id)

        async def send() -> None:
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    await context.flush()
                else:
                    self._mark_started()
                    await context.append(data)
            await context.end()

        async def receive() -> None:
            async for event in context:
                if isinstance(event, Audio):
                    output_emitter.push(event.pcm)
                elif isinstance(event, SegmentEnd):
                    output_emitter.push_timed_transcript(
                        TimedString(text=event.text, start_time=event.start_s, end_time=event.end_s)
                    )
                elif isinstance(event, Refused):
                    logger.warning(
                        "voxstream refused text of context %s: %s: %s", context.id, event.code, event.message
                    )

        try:
            await asyncio.gather(send(), receive())
        except ClientError as error:
            raise _api_error(error) from error
        finally:
            if not context.ended:  # interrupted (aclose) or failed: stop the server's work on it
                await asyncio.shield(context.cancel())


def _api_error(error: ClientError) -> Exception:
    if isinstance(error, Rejected):
        return APIStatusError(str(error), status_code=error.status, body=error.body)
    if isinstance(error, ContextFailed):
        status = 400 if error.code in _CLIENT_FAULTS else 503 if error.code == "over_capacity" else 500
        return APIStatusError(f"{error.code}: {error.message}", status_code=status, request_id=error.ctx)
    return APIConnectionError(str(error))
