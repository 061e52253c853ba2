"""`/v1/voices`: clone a voice from an upload, list, read and delete voices (wsserver.voices keeps them).

`POST /v1/voices` takes multipart form data: `audio` (a WAV, FLAC, MP3, Ogg or WebM file), `name`, `transcript` (what
the audio says: needed for the `prompt` and `both` roles), `role`: `prompt` (continuation: the default, on every
model), `reference` (an isolated timbre reference, VoxCPM2) or `both` (prompt and reference from the same audio,
VoxCPM2), and optionally `lora`: a loaded LoRA adapter the voice speaks with (a request may name another). The audio
is decoded on a worker thread, encoded once on the engine, and stored before the id is returned: 201 with the new
voice, or 200 with the one already stored for the same content.
"""

from __future__ import annotations

import asyncio
import logging
import unicodedata
from typing import TYPE_CHECKING

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine import EngineError, GenerationRequest
from engine.streams import EngineHandle
from wsserver.decoding import AudioError, UploadLimits, decode
from wsserver.http import ApiError, json_response
from wsserver.loras import LoRAs
from wsserver.voices import ROLES, Voice, VoiceLimitError, VoiceStore, upload_id

if TYPE_CHECKING:
    from wsserver.server import TTSServer

logger = logging.getLogger(__name__)

_FORM_FIELD_BYTES = 64 * 1024  # the text fields of an upload; the audio file has its own limit
_PROBE_TEXT = "Hello."  # a voice must leave room for speech after it: checked with this target text


def voice_routes(server: TTSServer) -> list[Route]:
    uploading = 0  # uploads in progress

    def store() -> VoiceStore:
        if server.voices is None or server.engine is None:
            raise ApiError(503, "starting", "the model is still loading", Retry_After="5")
        return server.voices

    async def list_voices(_: Request) -> Response:
        voices = store()
        listing = {"object": "list", "data": [v.describe() for v in voices.voices()], "aliases": voices.aliases}
        return json_response(200, listing)

    async def get_voice(request: Request) -> Response:
        voice = store().get(request.path_params["voice_id"])
        if voice is None:
            raise ApiError(404, "voice_not_found", f"no voice {request.path_params['voice_id']!r}")
        return json_response(200, voice.describe())

    async def delete_voice(request: Request) -> Response:
        voice_id = request.path_params["voice_id"]
        try:
            deleted = store().delete(voice_id)
        except KeyError:
            raise ApiError(409, "voice_fixed", f"voice {voice_id!r} is built in or from --voices-dir") from None
        except OSError as exc:
            raise ApiError(500, "storage_error", f"cannot delete voice {voice_id!r}: {exc.strerror}") from None
        if not deleted:
            raise ApiError(404, "voice_not_found", f"no stored voice {voice_id!r}")
        # Contexts already using it keep their copy: deleting never breaks a running stream.
        return json_response(200, {"id": voice_id, "object": "voice", "deleted": True})

    async def create_voice(request: Request) -> Response:
        nonlocal uploading
        voices, limits = store(), server.config.uploads
        assert server.engine is not None
        if uploading >= limits.max_concurrent:
            message = f"max_concurrent={limits.max_concurrent} uploads are in progress; retry shortly"
            raise ApiError(429, "too_many_uploads", message, Retry_After="1")
        uploading += 1
        try:
            upload = await _read_form(request, limits)
            if upload["lora"] and upload["lora"] not in LoRAs(server.engines):
                message = f"LoRA adapter {upload['lora']!r} is not loaded; GET /v1/loras lists them"
                raise ApiError(400, "unknown_lora", message, param="lora")
            voice = await _clone(server.engine, voices, limits, **upload)
            stored, new = await _store(voices, voice)
        finally:
            uploading -= 1
        return json_response(201 if new else 200, stored.describe())

    return [
        Route("/v1/voices", list_voices, methods=["GET"]),
        Route("/v1/voices", create_voice, methods=["POST"]),
        Route("/v1/voices/{voice_id}", get_voice, methods=["GET"]),
        Route("/v1/voices/{voice_id}", delete_voice, methods=["DELETE"]),
    ]


async def _read_form(request: Request, limits: UploadLimits) -> dict[str, object]:
    """The upload's fields, checked (everything but the audio, which `decode` checks)."""
    if not request.headers.get("Content-Type", "").startswith("multipart/form-data"):
        raise ApiError(400, "bad_form", "send multipart/form-data with an 'audio' file")
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=_FORM_FIELD_BYTES)
    except MultiPartException as exc:
        raise ApiError(400, "bad_form", f"the body is not a valid multipart form: {exc.message}") from None
    audio = form.get("audio")
    if not isinstance(audio, UploadFile):
        raise ApiError(400, "missing_field", "'audio' (a file) is required", param="audio")
    fields = {name: form.get(name, "") for name in ("name", "transcript", "role", "lora")}
    if not all(isinstance(value, str) for value in fields.values()):
        raise ApiError(400, "bad_request", "name, transcript and role are text fields, not files")
    name, transcript, role, lora = (str(fields[key]).strip() for key in ("name", "transcript", "role", "lora"))
    role = role or "prompt"
    if role not in ROLES:
        raise ApiError(400, "bad_request", f"role must be one of {list(ROLES)}", param="role")
    if not name:
        raise ApiError(400, "missing_field", "'name' is required", param="name")
    if len(name) > limits.max_name_chars or any(unicodedata.category(c).startswith("C") for c in name):
        message = f"name: at most {limits.max_name_chars} printable characters"
        raise ApiError(400, "bad_request", message, param="name")
    if role != "reference" and not transcript:
        message = f"'transcript' (what the audio says) is required for role {role!r}"
        raise ApiError(400, "missing_field", message, param="transcript")
    if len(transcript) > limits.max_transcript_chars:
        message = f"the transcript exceeds max_transcript_chars={limits.max_transcript_chars}"
        raise ApiError(400, "transcript_too_long", message, param="transcript")
    return {"data": await audio.read(), "name": name, "transcript": transcript, "role": role, "lora": lora}


async def _clone(
    engine: EngineHandle,
    voices: VoiceStore,
    limits: UploadLimits,
    data: bytes,
    name: str,
    transcript: str,
    role: str,
    lora: str,
) -> Voice:
    """Decode, check and encode an upload (or find the voice already stored for the same content)."""
    info = engine.info
    if role not in info.voice_roles:
        message = f"this model makes no voice of role {role!r} (it takes {list(info.voice_roles)})"
        raise ApiError(400, "unsupported", message, param="role")
    try:
        wav = await asyncio.to_thread(decode, data, info.encoder_sample_rate, limits)
    except AudioError as exc:
        status = 413 if exc.code == "audio_too_big" else 400
        raise ApiError(status, exc.code, str(exc), param="audio") from None
    voice_id = upload_id(wav, role, transcript, info.audio_encoder_id, lora)
    if (existing := voices.get(voice_id)) is not None:
        return existing
    try:
        prompt = await engine.encode_audio(wav, padding="left") if role != "reference" else None
        reference = await engine.encode_audio(wav, padding="right") if role != "prompt" else None
    except EngineError as exc:
        raise ApiError(503, "engine_error", f"cannot encode the audio now: {exc}", Retry_After="5") from None
    voice = Voice(
        voice_id,
        name=name,
        role=role,
        text=transcript if role != "reference" else "",
        latents=prompt,
        reference_latents=reference,
        source="upload",
        duration_s=wav.size / info.encoder_sample_rate,
        lora=lora or None,
    )
    try:
        await engine.check(GenerationRequest(text=_PROBE_TEXT, prompt=voice.prompt()))
    except EngineError as exc:
        message = f"the voice leaves the model no room to speak; use shorter audio or transcript ({exc})"
        raise ApiError(400, "voice_too_long", message) from None
    return voice


async def _store(voices: VoiceStore, voice: Voice) -> tuple[Voice, bool]:
    try:
        return await asyncio.to_thread(voices.add, voice)
    except VoiceLimitError as exc:
        raise ApiError(409, "too_many_voices", str(exc)) from None
    except OSError as exc:
        logger.error("storing voice %s failed: %s", voice.id, exc)
        raise ApiError(507, "storage_error", f"the voice could not be stored: {exc.strerror}") from None
