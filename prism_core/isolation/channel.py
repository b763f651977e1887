"""Messages between a process and its isolated children (conformance workers, plugin probes):
pickled objects, each preceded by its length, over pipes; a reader waits with a deadline and
a stop flag so that the waiting side can give up on a child that hangs or is no longer wanted."""

from __future__ import annotations

import os
import pickle
import select
import struct
import threading
import time
from typing import Any

POLL = 0.25  # seconds between checks for a stop request while waiting

_HEAD = struct.Struct("<Q")


def send(fd: int, obj: Any) -> None:
    """Write one message to ``fd``."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEAD.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class Closed(Exception):
    """The other end closed the pipe (the process ended)."""


class Late(Exception):
    """The deadline passed."""


class Stopped(Exception):
    """The stop flag was set."""


class Reader:
    """Reads the messages arriving on ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _frame(self) -> tuple[bool, Any]:
        if len(self.buf) < _HEAD.size:
            return False, None
        (n,) = _HEAD.unpack_from(self.buf)
        if len(self.buf) < _HEAD.size + n:
            return False, None
        data = bytes(self.buf[_HEAD.size:_HEAD.size + n])
        del self.buf[:_HEAD.size + n]
        return True, pickle.loads(data)

    def get(self, deadline: float | None = None, stop: threading.Event | None = None) -> Any:
        """The next message; Late after ``deadline`` (monotonic), Stopped when ``stop`` is set,
        Closed when the other end closed."""
        while True:
            ok, msg = self._frame()
            if ok:
                return msg
            if stop is not None and stop.is_set():
                raise Stopped
            wait = POLL if stop is not None or deadline is not None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Late
                wait = min(wait, left)
            ready, _, _ = select.select([self.fd], [], [], wait)
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    raise Closed
                self.buf += chunk
