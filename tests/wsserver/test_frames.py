from __future__ import annotations

from wsserver.frames import HEADER, FrameHeader


def test_header_is_20_bytes_little_endian() -> None:
    header = FrameHeader(kind=1, handle=0x0102, seq=0x03040506, pts=7, segment=9, flags=3)
    data = header.pack()
    assert HEADER.size == 20 and data == bytes([1, 1, 2, 1, 6, 5, 4, 3, 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 3, 0])
    assert FrameHeader.unpack(data + b"xy") == (header, b"xy")
