"""Error codes and close codes of `ttsws/1`, and the exception the sans-I/O core raises for them."""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """`error.code` values (protocol page, "Errors"); `unsupported`, `idle_timeout` and `stalled` are our additions."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"  # schema: missing field, wrong type, value out of range, too big
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_CTX = "unknown_ctx"
    CTX_EXISTS = "ctx_exists"
    BAD_FORMAT = "bad_format"
    BAD_VOICE = "bad_voice"
    BAD_LORA = "bad_lora"  # a LoRA adapter name that is not loaded (our addition)
    UNSUPPORTED = "unsupported"  # the model has no such feature: an instruction, a language (our addition)
    TEXT_TOO_LONG = "text_too_long"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    OVER_CAPACITY = "over_capacity"
    RATE_LIMITED = "rate_limited"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"
    IDLE_TIMEOUT = "idle_timeout"
    STALLED = "stalled"


# Client mistakes that count toward the bad-request loop (close 4400). Races that a correct client
# can hit (text for a context it just cancelled, a full server) do not count.
CLIENT_FAULTS = frozenset({ErrorCode.BAD_JSON, ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_TYPE, ErrorCode.RATE_LIMITED})


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses; each fatal error is followed by one of these."""

    GOING_AWAY = 1001  # the server closes while the session is still open (after a drain, only non-readers)
    BAD_REQUEST_LOOP = 4400
    UNAUTHORIZED = 4401
    STALLED = 4408  # the client stopped reading, or the session sat idle past idle_timeout_s
    MESSAGE_TOO_BIG = 4413
    OVER_CAPACITY = 4429
    INTERNAL = 4500
    DRAINING = 4503


class ProtocolError(Exception):
    """A client message the core refuses: answered with `error {code, message, ctx}`, never fatal by itself."""

    def __init__(self, code: ErrorCode, message: str, ctx: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ctx = ctx
