"""Typed `ttsws/1` messages: client messages parsed and checked against the schema, server messages serialised.

Parsing never raises anything but `ProtocolError`; every failure maps to an `error.code` the client can act on
(`bad_json`, `bad_message`, `unknown_type`; `bad_format` for audio settings the server cannot produce; `unsupported`
for an instruction or language the model does not take).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from wsserver.errors import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from engine import ModelInfo

PROTOCOL = "ttsws/1"
FORMATS = ("pcm_s16le", "pcm_f32le", "opus", "mulaw")
PCM_RATES = (8000, 16000, 24000, 48000)  # plus the model's native rate
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the rates libopus encodes at
OPUS_FRAME_MS = (10, 20, 40, 60)  # Opus frame durations that are whole milliseconds
MULAW_RATE = 8000
MAX_CTX_CHARS = 128
# An instruction is read into every segment's prompt (KV positions and prefill each time): a style, not a script.
MAX_INSTRUCTION_CHARS = 1000


# -- settings: what a context is created with ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputSettings:
    format: str = "pcm_s16le"
    sample_rate: int | None = None  # None: the format's default (native for PCM, 48000 for Opus, 8000 for mu-law)
    frame_ms: int = 20
    bitrate: int = 32000  # Opus only

    def resolved(self, native_rate: int) -> OutputSettings:
        """The settings with the default rate filled in; `bad_format` if this server cannot produce them."""
        if self.format not in FORMATS:
            raise ProtocolError(ErrorCode.BAD_FORMAT, f"format must be one of {list(FORMATS)}, got {self.format!r}")
        default_rate = {"opus": 48000, "mulaw": MULAW_RATE}.get(self.format, native_rate)
        rate = default_rate if self.sample_rate is None else self.sample_rate
        allowed = {"opus": OPUS_RATES, "mulaw": (MULAW_RATE,)}.get(self.format, (*PCM_RATES, native_rate))
        if rate not in allowed:
            raise ProtocolError(
                ErrorCode.BAD_FORMAT, f"{self.format} sample_rate must be one of {sorted(set(allowed))}"
            )
        if self.format == "opus":
            if self.frame_ms not in OPUS_FRAME_MS:
                raise ProtocolError(ErrorCode.BAD_FORMAT, f"opus frame_ms must be one of {list(OPUS_FRAME_MS)}")
            if not 6000 <= self.bitrate <= 510000:
                raise ProtocolError(ErrorCode.BAD_FORMAT, "opus bitrate must be within [6000, 510000]")
        elif not 10 <= self.frame_ms <= 1000 or rate * self.frame_ms % 1000:
            raise ProtocolError(
                ErrorCode.BAD_FORMAT, "frame_ms must be within [10, 1000] and a whole number of samples"
            )
        return dataclasses.replace(self, sample_rate=rate)


@dataclass(frozen=True, slots=True)
class BufferingSettings:
    mode: str = "auto"  # "auto" | "manual"
    first_min_chars: int = 20
    max_wait_ms: int = 300
    max_segment_chars: int = 300

    def check(self) -> None:
        if self.mode not in ("auto", "manual"):
            raise _bad("buffering.mode must be 'auto' or 'manual'")
        if not 1 <= self.first_min_chars <= 1000:
            raise _bad("buffering.first_min_chars must be within [1, 1000]")
        if not 0 <= self.max_wait_ms <= 60000:
            raise _bad("buffering.max_wait_ms must be within [0, 60000]")
        if not 20 <= self.max_segment_chars <= 4000:
            raise _bad("buffering.max_segment_chars must be within [20, 4000]")


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    # The engine's defaults and ranges (engine.params.GenerationParams), checked here so a bad value is refused
    # when the client sends it rather than when a segment reaches the engine.
    cfg_value: float = 2.0
    temperature: float = 1.0
    inference_timesteps: int = 10
    seed: int | None = None  # None: a fresh seed per segment

    def check(self) -> None:
        if not 0.0 <= self.cfg_value <= 10.0:
            raise _bad("generation.cfg_value must be within [0, 10]")
        if not 0.0 <= self.temperature <= 2.0:
            raise _bad("generation.temperature must be within [0, 2]")
        if not 1 <= self.inference_timesteps <= 100:
            raise _bad("generation.inference_timesteps must be within [1, 100]")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise _bad("generation.seed must be within [0, 2**63)")


@dataclass(frozen=True, slots=True)
class SettingsPatch:
    """A partial update: only the fields the client sent (already type-checked)."""

    voice: str | None = None
    lora: str | None = None
    instruction: str | None = None
    language: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    buffering: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Settings:
    voice: str = "default"
    lora: str = ""  # a loaded LoRA adapter's name; "": the voice's adapter, if it names one, else none
    instruction: str = ""  # how to speak (ModelInfo.instruction); "" for none
    language: str = ""  # one of ModelInfo.languages; "" lets the model decide
    output: OutputSettings = OutputSettings()
    buffering: BufferingSettings = BufferingSettings()
    generation: GenerationSettings = GenerationSettings()

    def merged(
        self, patch: SettingsPatch, voices: Container[str], model: ModelInfo, loras: Container[str] = ()
    ) -> Settings:
        """These settings with `patch` applied, checked as a whole (so a bad patch changes nothing)."""
        voice = self.voice if patch.voice is None else patch.voice
        if voice not in voices:
            raise ProtocolError(ErrorCode.BAD_VOICE, f"unknown voice {voice!r}; hello.voices lists them")
        lora = self.lora if patch.lora is None else patch.lora
        if lora and lora not in loras:
            raise ProtocolError(ErrorCode.BAD_LORA, f"unknown LoRA adapter {lora!r}; hello.loras lists them")
        instruction = self.instruction if patch.instruction is None else patch.instruction
        language = self.language if patch.language is None else patch.language
        merged = Settings(
            voice=voice,
            lora=lora,
            instruction=checked_instruction(instruction, model),
            language=checked_language(language, model),
            output=dataclasses.replace(self.output, **patch.output),
            buffering=dataclasses.replace(self.buffering, **patch.buffering),
            generation=dataclasses.replace(self.generation, **patch.generation),
        )
        merged.output.resolved(model.sample_rate)
        merged.buffering.check()
        merged.generation.check()
        return merged

    def effective(self, native_rate: int) -> dict[str, Any]:
        return {
            "voice": self.voice,
            "lora": self.lora,
            "instruction": self.instruction,
            "language": self.language,
            "output": dataclasses.asdict(self.output.resolved(native_rate)),
            "buffering": dataclasses.asdict(self.buffering),
            "generation": dataclasses.asdict(self.generation),
        }


def checked_instruction(instruction: str, model: ModelInfo) -> str:
    """`instruction` if the model honours it ("" always passes); `unsupported` or `bad_message` if not."""
    if not instruction:
        return ""
    if not model.instruction:
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {model.name!r} takes no instruction")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise _bad(f"instruction exceeds {MAX_INSTRUCTION_CHARS} characters")
    return instruction


def checked_language(language: str, model: ModelInfo) -> str:
    """The model's spelling of `language`, matched regardless of case ("" lets the model decide); `unsupported` for
    a language the model does not list."""
    if not language:
        return ""
    for name in model.languages:
        if name.casefold() == language.casefold():
            return name
    if not model.languages:
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {model.name!r} takes no language")
    raise ProtocolError(
        ErrorCode.UNSUPPORTED, f"unsupported language {language!r}; the model takes {list(model.languages)}"
    )


# -- client -> server ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    defaults: SettingsPatch


@dataclass(frozen=True, slots=True)
class Ping:
    t: Any


@dataclass(frozen=True, slots=True)
class ContextCreate:
    ctx: str
    settings: SettingsPatch
    text: str = ""


@dataclass(frozen=True, slots=True)
class TextAppend:
    ctx: str
    text: str
    flush: bool = False


@dataclass(frozen=True, slots=True)
class ContextFlush:
    ctx: str


@dataclass(frozen=True, slots=True)
class ContextEnd:
    ctx: str


@dataclass(frozen=True, slots=True)
class ContextCancel:
    ctx: str


ClientMessage = SessionUpdate | Ping | ContextCreate | TextAppend | ContextFlush | ContextEnd | ContextCancel


def parse_client_message(data: str | bytes) -> ClientMessage:
    """One client text frame -> a typed message. Unknown top-level fields are ignored (forward compatibility)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _bad("a message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise _bad("'type' must be a string")
    if kind == "ping":
        t = obj.get("t")
        try:  # the pong echoes it: parsing takes nesting that serializing refuses (1024 levels against 254)
            orjson.dumps({"t": t})  # as deep as in the pong
        except orjson.JSONEncodeError:
            raise _bad("'t' is nested too deeply to echo") from None
        return Ping(t=t)
    if kind == "session.update":
        return SessionUpdate(defaults=_settings_patch(_field(obj, "defaults", dict, required=True)))
    parse = _CTX_MESSAGES.get(kind)
    if parse is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}")
    ctx = _field(obj, "ctx", str, required=True)
    if not 1 <= len(ctx) <= MAX_CTX_CHARS:
        raise _bad(f"'ctx' must have 1 to {MAX_CTX_CHARS} characters")
    try:
        return parse(ctx, obj)
    except ProtocolError as exc:
        exc.ctx = ctx
        raise


_CTX_MESSAGES = {
    "context.create": lambda ctx, obj: ContextCreate(
        ctx=ctx, settings=_settings_patch(obj), text=_field(obj, "text", str, default="")
    ),
    "text.append": lambda ctx, obj: TextAppend(
        ctx=ctx, text=_field(obj, "text", str, required=True), flush=_field(obj, "flush", bool, default=False)
    ),
    "context.flush": lambda ctx, obj: ContextFlush(ctx=ctx),
    "context.end": lambda ctx, obj: ContextEnd(ctx=ctx),
    "context.cancel": lambda ctx, obj: ContextCancel(ctx=ctx),
}

# JSON type each annotation of a settings dataclass accepts; `| None` fields also take null.
_JSON_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "int | None": int}


def _settings_patch(obj: dict[str, Any]) -> SettingsPatch:
    return SettingsPatch(
        voice=_field(obj, "voice", str),
        lora=_field(obj, "lora", str),
        instruction=_field(obj, "instruction", str),
        language=_field(obj, "language", str),
        output=_group(obj, "output", OutputSettings),
        buffering=_group(obj, "buffering", BufferingSettings),
        generation=_group(obj, "generation", GenerationSettings),
    )


def _group(obj: dict[str, Any], name: str, settings: type) -> dict[str, Any]:
    """Type-check one settings object against its dataclass. Unknown keys are refused: a typo must not pass."""
    group = _field(obj, name, dict, default={})
    known = {f.name: f.type for f in dataclasses.fields(settings)}
    patch = {}
    for key, value in group.items():
        if key not in known:
            raise _bad(f"unknown field {name}.{key}")
        if value is None and "None" in known[key]:
            patch[key] = None
            continue
        patch[key] = _checked(f"{name}.{key}", value, _JSON_TYPES[known[key]])
    return patch


def _field(obj: dict[str, Any], key: str, kind: type, *, required: bool = False, default: Any = None) -> Any:
    if key not in obj:
        if required:
            raise _bad(f"missing field {key!r}")
        return default
    return _checked(key, obj[key], kind)


def _checked(name: str, value: Any, kind: type) -> Any:
    # bool is an int subclass in Python but not a number on the wire; ints are fine where floats are expected.
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise _bad(f"{name!r} must be of type {_TYPE_NAMES[kind]}")
    return value


_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, message)


# -- server -> client ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    TYPE: ClassVar[str] = "hello"
    session_id: str
    model: dict[str, Any]
    formats: list[str]
    sample_rates: list[int]
    voices: list[str]
    limits: dict[str, Any]
    loras: dict[str, Any]  # {"loaded": [names], "max_loras": N, "max_lora_rank": R} (our addition)
    protocol: str = PROTOCOL


@dataclass(frozen=True, slots=True)
class SessionUpdated:
    TYPE: ClassVar[str] = "session.updated"
    effective: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    t: Any


@dataclass(frozen=True, slots=True)
class ContextCreated:
    TYPE: ClassVar[str] = "context.created"
    ctx: str
    handle: int
    output: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    TYPE: ClassVar[str] = "segment.started"
    ctx: str
    segment: int
    text: str


@dataclass(frozen=True, slots=True)
class QueueStatus:
    TYPE: ClassVar[str] = "queue.status"
    ctx: str
    position: int


@dataclass(frozen=True, slots=True)
class ContextFlushed:
    TYPE: ClassVar[str] = "context.flushed"
    ctx: str
    segment: int


@dataclass(frozen=True, slots=True)
class ContextDone:
    TYPE: ClassVar[str] = "context.done"
    ctx: str
    last_seq: int
    audio_ms: float
    metrics: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class ContextCancelled:
    TYPE: ClassVar[str] = "context.cancelled"
    ctx: str
    last_seq: int


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    fatal: bool = False
    ctx: str | None = None
    # With `ctx`: whether that context is over (nothing more will come for it) or still open (only the message
    # was refused). Without it a client could not tell "your text.append was too long" from "your context died".
    ended: bool | None = None


@dataclass(frozen=True, slots=True)
class WarningMessage:
    TYPE: ClassVar[str] = "warning"
    code: str
    message: str
    ctx: str | None = None


ServerMessage = (
    Hello
    | SessionUpdated
    | Pong
    | ContextCreated
    | SegmentStarted
    | QueueStatus
    | ContextFlushed
    | ContextDone
    | ContextCancelled
    | ErrorMessage
    | WarningMessage
)


def serialize(message: ServerMessage) -> bytes:
    """UTF-8 JSON for one text frame; top-level fields that are None (an optional `ctx`) are left out."""
    body: dict[str, Any] = {"type": message.TYPE}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if value is not None:
            body[f.name] = value
    return orjson.dumps(body)
