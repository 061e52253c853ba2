"""Pipecat: `VoxstreamTTSService`, a `TTSService` on one voxstream session (`pip install "voxstream[pipecat]"`).

Each Pipecat turn is one `ttsws/1` context (Pipecat reuses a context id within a turn): the text Pipecat hands to
`run_tts` is appended to it as it comes, the end of the turn ends it, and an interruption cancels it while the session
stays open for the next turn. The server segments the text itself (first segment at the first clause, then whole
sentences), so the service asks Pipecat for tokens, not sentences, by default.

Audio arrives as 16-bit PCM at the pipeline's output rate (8, 16, 24 or 48 kHz, or the model's own rate); each
segment's text becomes a `TTSTextFrame` timed at the start of its audio. That is all the timing the model gives:
segment text with start and end, no word timing (docs/client.md says why).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService

from wsserver.client import Audio, Client, ClientError, Context, Done, Refused, SegmentStart


class VoxstreamTTSService(TTSService):
    """Streaming TTS on a voxstream server.

    Args:
        url: the server, `ws://host:8000` (or the full `/v1/tts/ws` URL).
        api_key: the server's `--api-key`, if it has one.
        voice: a name from the server's voices (`hello.voices`); runtime-updatable through `Settings(voice=...)`.
        lora: a LoRA adapter loaded on the server (`hello.loras.loaded`).
        instruction: how to speak, for a model that takes instructions (`hello.model.instruction`, Qwen3-TTS).
        language: one of `hello.model.languages`, in the model's spelling (e.g. "english"), not a Pipecat `Language`.
        generation: the protocol's generation settings, e.g. `{"cfg_value": 2.0, "inference_timesteps": 10}`.
        buffering: the protocol's buffering settings (how the server cuts text into segments).
        sample_rate: the output rate; by default the pipeline's.

    `lora`, `instruction` and `language` go with every turn's context (None: not sent, the server's default); a
    server that cannot honour one refuses the turn (`bad_lora`, `unsupported`), which arrives as an `ErrorFrame`.
    """

    Settings = TTSSettings

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None = None,
        voice: str = "default",
        lora: str | None = None,
        instruction: str | None = None,
        language: str | None = None,
        generation: Mapping[str, Any] | None = None,
        buffering: Mapping[str, Any] | None = None,
        sample_rate: int | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = TTSSettings(model=None, voice=voice, language=None)
        if settings is not None:
            defaults.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            # The service pushes the text frames itself, timed by the segments' audio.
            push_text_frames=False,
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._client = Client(url, api_key=api_key)
        # Sent as they are with every context; the client leaves out those that are None.
        self._context_settings: dict[str, Any] = {
            "lora": lora,
            "instruction": instruction,
            "language": language,
            "generation": generation,
            "buffering": buffering,
        }
        self._contexts: dict[str, Context] = {}
        self._receivers: dict[str, asyncio.Task[None]] = {}

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._client.connect()  # the first turn should not wait for the handshake

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)  # returns once every open context has played out
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        try:
            context = self._contexts.get(context_id)
            if context is None or context.ended:
                context = await self._open(context_id)
            await context.append(text)
            await self.start_tts_usage_metrics(text)
        except ClientError as error:
            yield ErrorFrame(error=f"{self}: {error}")
            return
        yield None  # the audio comes through the receiver of this context

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of a turn (or of a spoken utterance): no more text for its context."""
        context = self._contexts.get(context_id or self.get_active_audio_context_id() or "")
        if context is not None and not context.ended:
            try:
                await context.end()
            except ClientError as error:
                await self.push_error(error_msg=f"{self}: {error}", exception=error)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the context on the server (its engine work stops), keep the session."""
        await self.stop_all_metrics()
        context = self._contexts.get(context_id)
        if context is not None:
            await context.cancel()
        await super().on_audio_context_interrupted(context_id)

    async def _open(self, context_id: str) -> Context:
        output = {"format": "pcm_s16le", "sample_rate": self.sample_rate}
        voice = self._settings.voice if isinstance(self._settings.voice, str) else None
        context = await self._client.context(context_id, voice=voice, output=output, **self._context_settings)
        self._contexts[context_id] = context
        self._receivers[context_id] = self.create_task(self._receive(context), f"voxstream-{context_id}")
        return context

    async def _receive(self, context: Context) -> None:
        """One context's events into its Pipecat audio context, in order, until it ends."""
        context_id = context.id
        try:
            async for event in context:
                if isinstance(event, Audio):
                    frame = TTSAudioRawFrame(event.pcm, event.sample_rate, 1, context_id=context_id)
                    await self.append_to_audio_context(context_id, frame)
                elif isinstance(event, SegmentStart):
                    # The segment as one timed text unit: its text carries its own spacing.
                    await self.add_word_timestamps(
                        [(event.text, event.start_s)], context_id, includes_inter_frame_spaces=True
                    )
                elif isinstance(event, Refused):
                    await self.push_error(error_msg=f"{self}: {event.code}: {event.message}")
                elif isinstance(event, Done):
                    await self.stop_ttfb_metrics()
        except ClientError as error:
            await self.push_error(error_msg=f"{self}: {error}", exception=error)
        finally:
            self._contexts.pop(context_id, None)
            self._receivers.pop(context_id, None)
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _close(self) -> None:
        for task in list(self._receivers.values()):
            await self.cancel_task(task)
        await self._client.close()
