"""The worker process of a conformance run (see :mod:`.workers`): it loads the backend and
the cases its parent names, then computes the cases it is sent and answers each with its
result. Started as ``python -c "...; serve(PARENT_PID)"`` by :class:`.workers.Worker`."""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
from typing import Any

from .channel import Closed, Reader, send
from .runner import CaseResult
from .workers import Suite, fingerprint


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this worker when the thread that started it ends, so no worker
    outlives its run, even one stuck in native code."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def serve(parent: int) -> None:
    """The worker's main loop (started by :class:`.workers.Worker`)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C does
    chan = os.dup(1)
    os.dup2(2, 1)  # whatever a kernel prints goes to the log, not into the result channel
    faulthandler.enable()
    reader = Reader(0)
    try:
        _, init = reader.get()
    except Closed:
        return
    try:
        from ..plugin.registry import REGISTRY
        for label, kind, payload in init["plugins"]:
            plugin = importlib.import_module(payload) if kind == "module" else pickle.loads(payload)
            REGISTRY.register(plugin, label)
        backend = REGISTRY.get(init["backend"])
        reference = REGISTRY.reference()
        suite = Suite(**{**init["suite"], "ops": tuple(init["suite"]["ops"]) if init["suite"]["ops"] else None})
        cases = suite.cases()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which reports it per case
        send(chan, ("error", f"{type(e).__name__}: {e}"))
        return
    from .runner import _grad_case, refusal, run_case
    if suite.mode == "grad":
        def one(c: Any) -> CaseResult:
            return _grad_case(c, backend, None)
    else:
        def one(c: Any) -> CaseResult:
            return run_case(c, backend, reference, timeout=None)
    send(chan, ("ready", fingerprint(cases)))
    timeout = init["timeout"]
    while True:
        try:
            msg = reader.get()
        except Closed:
            return
        if msg[0] == "stop":
            return
        if timeout:  # where a hang is: dumped more often than the timeout, so before the parent kills this worker
            faulthandler.dump_traceback_later(max(timeout - 1.0, timeout / 2), repeat=True)
        skip = msg[2]
        for i in msg[1]:
            c = cases[i]
            r = (refusal(c, backend) or CaseResult(c, backend.name, *skip[c.key])) if c.key in skip else one(c)
            send(chan, ("result", i, {"status": r.status, "message": r.message, "err": r.err, "bound": r.bound,
                                       "worst": r.worst, "detail": r.detail}))
        faulthandler.cancel_dump_traceback_later()
        send(chan, ("done",))
