"""Frames: how the trusted checker and the grading host talk over a pipe (one JSON message per frame).

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Both sides use this module:
the host inside the sandbox (which imports nothing from the repository) and the trusted side, which reads
every frame with a size limit and a deadline, so a host that floods, stalls or dies costs it nothing.
"""

from __future__ import annotations

import json
import os
import select
import time

HEADER = 4


class ChannelClosed(Exception):
    """The other side closed the pipe, sent a malformed frame, or did not answer in time (the message says)."""


def encode(message) -> bytes:
    """One frame holding `message` (JSON without NaN: plain data sends non-finite floats as strings)."""
    body = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    return len(body).to_bytes(HEADER, "big") + body


def write(fd: int, message) -> None:
    """Send `message` as one frame on the file descriptor `fd` (blocking until all of it is written)."""
    data = memoryview(encode(message))
    while data:
        data = data[os.write(fd, data):]


def read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    """`size` bytes from `fd`, waiting at most until `deadline` (time.monotonic(); None: no limit)."""
    chunks, missing = [], size
    while missing:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise ChannelClosed("no complete answer in time")
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read(fd: int, max_bytes: int = 64 << 20, deadline: float | None = None):
    """The next frame's message from `fd`; ChannelClosed when the pipe ends, the frame is larger than
    `max_bytes` (checked before anything is allocated), it is not JSON, or `deadline` passes first."""
    size = int.from_bytes(read_exactly(fd, HEADER, deadline), "big")
    if size > max_bytes:
        raise ChannelClosed(f"a frame of {size} bytes is larger than the limit of {max_bytes}")
    try:
        return json.loads(read_exactly(fd, size, deadline))
    except (ValueError, RecursionError):
        raise ChannelClosed("a frame that is not valid JSON") from None
