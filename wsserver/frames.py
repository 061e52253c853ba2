"""The binary frame of `ttsws/1` (docs/protocol.md, "Binary frames"): a 20-byte little-endian header, then the payload.

Shared by the server's audio out (`wsserver.audio`) and the client library (`wsserver.client`), so both read the one
definition of the wire format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<BBHIQHH")  # version, kind, handle, seq, pts, segment, flags: 20 bytes, little-endian
VERSION = 1
KIND_AUDIO = 1
KIND_CODEC = 2  # codec header (OpusHead); no audio, no seq of its own
FLAG_SEGMENT_END = 1
FLAG_CONTEXT_END = 2
OPUS_CLOCK = 48000  # Opus timestamps count 48 kHz samples whatever the coded rate (RFC 7845)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    kind: int
    handle: int
    seq: int
    pts: int
    segment: int
    flags: int
    version: int = VERSION

    def pack(self) -> bytes:
        return HEADER.pack(self.version, self.kind, self.handle, self.seq, self.pts, self.segment, self.flags)

    @classmethod
    def unpack(cls, frame: bytes) -> tuple[FrameHeader, bytes]:
        version, kind, handle, seq, pts, segment, flags = HEADER.unpack_from(frame)
        return cls(kind, handle, seq, pts, segment, flags, version), frame[HEADER.size :]
