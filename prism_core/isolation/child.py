"""A child Python process that runs ``serve(parent_pid)`` of a module and talks to its parent
over pickled messages (:mod:`.channel`): the parent writes to the child's stdin, the child
answers on its original stdout. Whatever the child prints goes to its stderr, kept in a
temporary file so that the parent can read faulthandler's last traceback after a crash or
a hang. The child sees the parent's ``sys.path`` and environment."""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
from typing import Any

from .channel import Reader, send

STARTUP_TIMEOUT = 120.0  # seconds for a child to import Prism (a loaded machine is slow)


def signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)


def innermost(text: str) -> str:
    """' at FILE:LINE in FUNC' of the innermost frame of the last faulthandler dump in ``text``."""
    block = text.rsplit("most recent call first", 1)
    if len(block) < 2:
        return ""
    m = _FRAME.search(block[1])
    return f" at {m['file']}:{m['line']} in {m['func']}" if m else ""


class Child:
    """``python -c "from MODULE import serve; serve(PARENT_PID)"`` with pipes to this process."""

    def __init__(self, module: str, what: str = "worker") -> None:
        self.what = what  # how death() calls it: "the worker process was killed by ..."
        self.stderr = tempfile.TemporaryFile()
        code = f"import sys; sys.path[:] = {sys.path!r}; from {module} import serve; serve({os.getpid()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, start_new_session=True, close_fds=True)
        self.reader = Reader(self.proc.stdout.fileno())

    def send(self, msg: Any) -> bool:
        try:
            send(self.proc.stdin.fileno(), msg)
            return True
        except (OSError, ValueError):  # the child is gone (or closed); its exit status tells why
            return False

    def stderr_text(self) -> str:
        """The last 8 KiB the child wrote to stderr."""
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 8192))
            return self.stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def death(self) -> str:
        """Why the child ended ("the worker process was killed by SIGSEGV at FILE:LINE in FUNC"),
        after waiting for its exit; releases it."""
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        text = self.stderr_text()
        how = (f"the {self.what} process was killed by {signal_name(-rc)}" if rc is not None and rc < 0
               else f"the {self.what} process exited with status {rc}")
        self.close()
        return how + innermost(text)

    def hang_site(self) -> str:
        """Kill the child (it is late) and say where it hung: ' at FILE:LINE in FUNC' or ''."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        where = innermost(self.stderr_text())
        self.close()
        return where

    def kill(self) -> None:
        """End the child now and release it."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()
        self.close()

    def close(self) -> None:
        """Ask the child to end (kill it if it does not) and release its pipes."""
        if self.proc.poll() is None:
            self.send(("stop",))
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                f.close()
            except OSError:
                pass


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this child when the thread that started it ends, so no child
    outlives its parent, even one stuck in native code."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def become_child(parent: int) -> tuple[int, Reader]:
    """Set up this process as a :class:`Child` of ``parent``: it dies with its parent, ignores
    Ctrl-C (the parent decides), sends what it prints to stderr and dumps Python tracebacks on a
    fatal signal. Returns the channel to write answers to and the reader of the parent's messages."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chan = os.dup(1)
    os.dup2(2, 1)  # whatever the child prints goes to the log, not into the channel
    faulthandler.enable()
    return chan, Reader(0)
