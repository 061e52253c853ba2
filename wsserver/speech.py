"""`POST /v1/audio/speech`: OpenAI's speech endpoint, as the clients that call it behave.

The whole text is known up front, so it is cut into segments at once (the WebSocket segmenter, flushed) and each
segment continues the previous one's voice, exactly as a context's segments do; every segment queues for an engine
slot in the same fair FIFO as the WebSocket contexts. The audio leaves as it is made: resampled to the requested rate
(OpenAI's 24 kHz unless `sample_rate` says otherwise) and encoded in `response_format`, as chunked bytes
(`stream_format: "audio"`), as OpenAI's server-sent events (`"sse"`), or, with our `stream: false`, as one file with
its `Content-Length`. A client that disconnects ends its engine work at the next step, and one that stops reading
loses its request after `stall_timeout_s`. OpenAI's `instructions` is the model's instruction (ModelInfo.instruction),
refused by a model without one; `language` is our extension (one of ModelInfo.languages).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Container
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine import EngineError, ModelInfo
from wsserver import messages as m
from wsserver.access import Caller
from wsserver.audio import Resampler
from wsserver.continuity import Continuity
from wsserver.encoding import FORMATS, FileEncoder
from wsserver.errors import ErrorCode, ProtocolError
from wsserver.http import ApiError, over_capacity
from wsserver.loras import LoRAs
from wsserver.normalize import normalize
from wsserver.segmenter import Segmenter
from wsserver.voices import Voice, VoiceStore

if TYPE_CHECKING:
    from wsserver.server import TTSServer

logger = logging.getLogger(__name__)

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # accepted as names for the served model
DEFAULT_RATE = 24000  # OpenAI's rate for every format


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    input: str
    voice: Voice
    instruction: str  # OpenAI's `instructions`, where the model takes one
    language: str  # our extension: one of ModelInfo.languages, "" lets the model decide
    response_format: str
    sample_rate: int
    stream: bool  # False: the whole file with Content-Length
    sse: bool
    generation: m.GenerationSettings
    lora: str | None = None  # the LoRA adapter to speak with


def parse_speech(
    body: bytes, voices: VoiceStore, info: ModelInfo, max_chars: int, loras: Container[str] = ()
) -> SpeechRequest:
    """The request body -> a checked request; ApiError (400, or 404 for an unknown model) names the bad field."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")

    def field(name: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        value = obj.get(name, default)
        if value is None and required:
            raise ApiError(400, "missing_field", f"'{name}' is required", param=name)
        if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
            raise ApiError(400, "bad_request", f"'{name}' has the wrong type", param=name)
        return value

    model = field("model", str, info.name)
    if model not in (info.name, *OPENAI_MODELS):
        raise ApiError(404, "model_not_found", f"model {model!r} is not served here; GET /v1/models lists it", "model")
    text = field("input", str, required=True)
    if not text.strip():
        raise ApiError(400, "empty_input", "'input' has nothing to say", param="input")
    if len(text) > max_chars:
        raise ApiError(400, "text_too_long", f"'input' exceeds max_text_chars={max_chars}", param="input")
    voice_field = field("voice", (str, dict), required=True)
    voice_key = voice_field.get("id") if isinstance(voice_field, dict) else voice_field
    voice = voices.get(voice_key) if isinstance(voice_key, str) else None
    if voice is None:
        raise ApiError(400, "unknown_voice", f"unknown voice {voice_key!r}; GET /v1/voices lists them", "voice")
    lora = field("lora", str) or voice.lora  # our extension: a loaded LoRA adapter (default: the voice's, if any)
    if lora and lora not in loras:
        raise ApiError(400, "unknown_lora", f"LoRA adapter {lora!r} is not loaded; GET /v1/loras lists them", "lora")
    try:
        instruction = m.checked_instruction(field("instructions", str, ""), info)
    except ProtocolError as exc:
        raise _refused(exc, "instructions") from None
    try:
        language = m.checked_language(field("language", str, ""), info)
    except ProtocolError as exc:
        raise _refused(exc, "language") from None
    speed = field("speed", (int, float), 1.0)
    if speed != 1.0:
        # Time-stretching the output would change the voice; the model has no honest speed control.
        raise ApiError(400, "unsupported", "only speed 1.0 is supported", param="speed")
    response_format = field("response_format", str, "mp3")
    if response_format not in FORMATS:
        raise ApiError(400, "unsupported_format", f"response_format must be one of {list(FORMATS)}", "response_format")
    fmt = FORMATS[response_format]
    sample_rate = field("sample_rate", int, DEFAULT_RATE)
    rates = (*fmt.rates, info.sample_rate) if fmt.any_rate else fmt.rates
    if sample_rate not in rates:
        message = f"{response_format} sample_rate must be one of {sorted(set(rates))}"
        raise ApiError(400, "unsupported_format", message, param="sample_rate")
    stream_format = field("stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise ApiError(400, "bad_request", "stream_format must be 'audio' or 'sse'", param="stream_format")
    stream = field("stream", bool, True)
    if not stream and stream_format == "sse":
        raise ApiError(400, "bad_request", "server-sent events are a stream: drop stream=false", param="stream")
    generation = m.GenerationSettings()
    try:
        generation = replace(
            generation,
            cfg_value=float(field("cfg_value", (int, float), generation.cfg_value)),
            temperature=float(field("temperature", (int, float), generation.temperature)),
            inference_timesteps=field("inference_timesteps", int, generation.inference_timesteps),
            seed=field("seed", int),
        )
        generation.check()
    except ProtocolError as exc:
        raise ApiError(400, "bad_request", exc.message.removeprefix("generation.")) from None
    return SpeechRequest(
        text,
        voice,
        instruction,
        language,
        response_format,
        sample_rate,
        stream,
        stream_format == "sse",
        generation,
        lora,
    )


def _refused(exc: ProtocolError, param: str) -> ApiError:
    """A field the WebSocket checks would refuse, as the HTTP error: `unsupported` stays, the rest is a bad request."""
    code = "unsupported" if exc.code is ErrorCode.UNSUPPORTED else "bad_request"
    return ApiError(400, code, exc.message, param=param)


def segments(text: str) -> list[str]:
    """The text as the engine reads it, segment by segment (the WebSocket's rules for a context ended at once)."""
    segmenter = Segmenter(m.BufferingSettings())
    segmenter.push(text, 0.0)
    segmenter.flush()
    pieces = []
    while (segment := segmenter.next_segment(0.0)) is not None:
        if speech := normalize(segment.text):
            pieces.append(speech)
    return pieces


class Synthesis:
    """One speech request's audio: its segments through the slot queue and the engine, resampled and encoded."""

    def __init__(self, server: TTSServer, info: ModelInfo, request: SpeechRequest, pieces: list[str]) -> None:
        self.server, self.info, self.request, self.pieces = server, info, request, pieces
        self.encoder = FileEncoder(request.response_format, request.sample_rate, streaming=request.stream)
        self.resampler = Resampler(info.sample_rate, request.sample_rate)
        self.patches = 0  # generated, all segments together

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes as they are made (streaming), or once, whole (blocking). EngineError if a segment fails."""
        server = self.server
        assert server.link is not None
        request = self.request
        continuity = Continuity(request.voice, self.info, server.config.carry_s, request.instruction, request.language)
        for index, text in enumerate(self.pieces):
            engine_request = continuity.request(
                text, request.generation, index, server.config.max_patches, request.lora
            )
            latents = []
            ticket = server.link.queue(_unannounced, continuing=index > 0)
            try:
                index = await ticket.granted
                engine = server.engines[index]
                moves = 0
                while True:
                    try:
                        async with contextlib.aclosing(engine.generate(engine_request)) as chunks:  # closed: cancelled
                            async for chunk in chunks:
                                latents.append(chunk.latents)
                                self.patches += 1
                                if data := self.encoder.push(self.resampler.process(chunk.samples)):
                                    yield data
                        break
                    except EngineError:
                        if latents or not server.can_move(engine, moves):
                            raise
                        moves += 1
                        server.link.release(ticket)  # its engine died before this segment's first chunk
                        ticket = server.link.queue(_unannounced, continuing=True, avoid=index)
                        index = await ticket.granted
                        engine = server.engines[index]
            finally:
                server.link.release(ticket)
            continuity.record(text, latents)
        tail = self.encoder.push(self.resampler.flush())
        yield tail + self.encoder.finish()

    @property
    def samples(self) -> int:
        return self.encoder.samples


class AudioResponse:
    """An ASGI response that generates while it watches the client: a disconnect cancels the generation at once (not
    at its next write, which for a request still queued for a slot could be seconds away), and a write the client
    does not take within `stall_timeout_s` ends it too."""

    def __init__(self, synthesis: Synthesis, caller: Caller) -> None:
        self.synthesis, self.caller = synthesis, caller  # the caller holds a seat until this response ends
        self.stall_timeout_s = synthesis.server.config.limits.stall_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.synthesis.server
        work = asyncio.ensure_future(self._respond(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        server.speeches.add(work)  # what a drain waits for, then cancels
        error = None
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            server.free_seat(self.caller)  # taken when the request was admitted
            for task in (work, watch):
                task.cancel()
            try:
                await asyncio.gather(work, watch, return_exceptions=True)
                error = None if work.cancelled() else work.exception()
                if isinstance(error, ClientStalled):
                    # Nothing more can reach this client; uvicorn closes the connection once this returns.
                    logger.info("speech request dropped: %s", error)
                    server.metrics.errors[ErrorCode.STALLED] += 1
            finally:
                # Only once the response is accounted for: whoever sees the request gone (a drain, /metrics) sees how
                # it ended. Removed before its cleanup, a stalled request was counted a loop iteration or more after
                # it had gone (a CI run's test saw it gone and no stall counted).
                server.speeches.discard(work)
        if error is not None and not isinstance(error, ClientStalled):
            raise error

    async def _respond(self, send: Send) -> None:
        request, synthesis = self.synthesis.request, self.synthesis
        content_type = "text/event-stream" if request.sse else FORMATS[request.response_format].content_type
        headers = {"Content-Type": content_type, "X-Sample-Rate": str(request.sample_rate), "Cache-Control": "no-store"}
        async with contextlib.aclosing(synthesis.chunks()) as chunks:  # closed on any way out: the engine work ends
            await self._stream(send, chunks, headers)

    async def _stream(self, send: Send, chunks: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        request, synthesis = self.synthesis.request, self.synthesis
        if not request.stream:
            try:
                body = b"".join([data async for data in chunks])
            except EngineError as exc:
                raise ApiError(500, "engine_error", f"generation failed: {exc}") from None
            headers |= {"Content-Length": str(len(body)), "X-Audio-Samples": str(synthesis.samples)}
            await self._send(send, _start(200, headers))
            await self._send(send, _body(body, more=False))
            return
        started = False
        try:
            async for data in chunks:
                if not started:
                    await self._send(send, _start(200, headers))
                    started = True
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                await self._send(send, _body(_sse(event) if request.sse else data))
        except EngineError as exc:
            if not started:
                raise ApiError(500, "engine_error", f"generation failed: {exc}") from None
            if not request.sse:
                raise  # the body stops short: a chunked body without its last chunk is an error to every client
            error = {"message": f"generation failed: {exc}", "code": "engine_error"}
            await self._send(send, _body(_sse({"type": "speech.audio.error", "error": error})))
        else:
            if request.sse:
                usage = {"output_tokens": synthesis.patches, "audio_samples": synthesis.samples}
                await self._send(send, _body(_sse({"type": "speech.audio.done", "usage": usage})))
        await self._send(send, _body(b"", more=False))

    async def _send(self, send: Send, message: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(self.stall_timeout_s):  # not wait_for: see wsserver.server on Python 3.11
                await send(message)
        except TimeoutError:
            raise ClientStalled(f"the client read nothing for stall_timeout_s={self.stall_timeout_s}") from None


class ClientStalled(Exception):
    """The client stopped reading a response."""


def _unannounced(_position: int) -> None:
    """A speech request has no channel for its place in the slot queue (SSE clients would not expect an event)."""


def _start(status: int, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


def _body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def speech_routes(server: TTSServer) -> list[Route]:
    async def speech(request: Request) -> AudioResponse:
        body = await request.body()
        engine, voices = server.engine, server.voices
        if engine is None or voices is None:
            raise over_capacity("starting")
        info, limits = engine.info, server.config.limits
        loras = LoRAs(server.engines)
        parsed = parse_speech(body, voices, info, limits.max_text_chars, loras)
        pieces = segments(parsed.input)
        if not pieces:
            raise ApiError(400, "empty_input", "'input' has nothing the model can say", param="input")
        caller = server.caller(request.headers, request.url.query, request.client.host if request.client else None)
        refusal = await server.admit(caller)
        if refusal is not None:
            raise refusal
        try:
            return AudioResponse(Synthesis(server, info, parsed, pieces), caller)  # it gives the seat back at its end
        except BaseException:
            server.free_seat(caller)
            raise

    return [Route("/v1/audio/speech", speech, methods=["POST"])]
