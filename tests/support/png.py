"""Checking a PNG without an image library: signature, IHDR size, IEND."""

from __future__ import annotations

import struct

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes, what: str = "the file") -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking that it is a whole PNG."""
    assert data[:8] == SIGNATURE, f"{what} is not a PNG"
    assert data[12:16] == b"IHDR", f"{what} has no IHDR chunk first"
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND", f"{what} is cut short (no IEND)"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
