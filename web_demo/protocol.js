// Wire protocol ttsws/1: binary frame header parsing and the words we show for
// protocol codes. Pure functions only (no DOM, no sockets) so every other module
// can rely on it and it can be read next to docs/protocol.md.

export const PROTOCOL = "ttsws/1";
export const HEADER_BYTES = 20;

export const FrameKind = Object.freeze({ AUDIO: 1, CODEC_HEADER: 2 });
export const FrameFlag = Object.freeze({ SEGMENT_END: 1, CONTEXT_END: 2 });

/**
 * Parse one binary frame (20-byte little-endian header, then payload).
 * `payload` is a view into the same ArrayBuffer; copy it if you keep it.
 */
export function parseFrame(buffer) {
  if (buffer.byteLength < HEADER_BYTES) throw new Error(`short frame: ${buffer.byteLength} bytes`);
  const view = new DataView(buffer);
  return {
    version: view.getUint8(0),
    kind: view.getUint8(1),
    handle: view.getUint16(2, true),
    seq: view.getUint32(4, true),
    // u64 on the wire; a Number is exact up to 2^53 samples (5900 years at 48 kHz).
    pts: Number(view.getBigUint64(8, true)),
    segment: view.getUint16(16, true),
    flags: view.getUint16(18, true),
    payload: new Uint8Array(buffer, HEADER_BYTES),
  };
}

/** Bytes per sample of the PCM-like formats; Opus packets have no fixed size. */
export const BYTES_PER_SAMPLE = Object.freeze({ pcm_s16le: 2, pcm_f32le: 4, mulaw: 1 });

/** The WebSocket URL of the same origin; the API key rides as `?token=` (a browser cannot set headers there). */
export function socketUrl(location, token = "") {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = token ? `?token=${encodeURIComponent(token)}` : "";
  return `${scheme}//${location.host}/v1/tts/ws${query}`;
}

// Server error codes in words a person can act on. The server's own message is
// shown next to these, so they stay short.
const ERROR_TITLES = {
  bad_json: "The server could not parse a message",
  bad_message: "The server rejected a message",
  unknown_type: "Unknown message type",
  unknown_ctx: "Unknown context",
  ctx_exists: "Context id already used",
  bad_format: "Unsupported audio format or sample rate",
  bad_voice: "Unknown voice",
  text_too_long: "Text is too long",
  too_many_contexts: "Too many open contexts",
  over_capacity: "Server is at capacity",
  rate_limited: "Too many requests",
  unauthorized: "Not authorised",
  internal: "Internal server error",
};

export function errorTitle(code) {
  return ERROR_TITLES[code] ?? `Server error (${code})`;
}

// WebSocket close codes (protocol page, "Errors") in words.
const CLOSE_REASONS = {
  1000: "Closed",
  1001: "Server going away",
  1006: "Connection lost",
  1007: "Invalid UTF-8 sent",
  1009: "Message too big",
  1011: "Server error",
  4400: "Too many bad messages",
  4401: "Not authorised (check the API key)",
  4408: "Timed out (idle or not reading audio)",
  4413: "Message too big",
  4429: "Server over capacity",
  4500: "Internal server error",
  4503: "Server is draining for a restart",
};

export function closeReason(code, reason) {
  const words = CLOSE_REASONS[code] ?? `Closed (${code})`;
  return reason ? `${words}: ${reason}` : words;
}

/** Close codes after which reconnecting later is the right move (busy, draining). */
export function isBusyClose(code) {
  return code === 4429 || code === 4503 || code === 1013;
}
