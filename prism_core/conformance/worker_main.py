"""The worker process of a conformance run (see :mod:`.workers`): it loads the backend and
the cases its parent names, then computes the cases it is sent and answers each with its
result. Started as ``python -c "...; serve(PARENT_PID)"`` by :class:`.workers.Worker`."""

from __future__ import annotations

import faulthandler
import importlib
import pickle
from typing import Any

from ..isolation.channel import Closed, send
from ..isolation.child import become_child
from .runner import CaseResult
from .workers import Suite, fingerprint


def serve(parent: int) -> None:
    """The worker's main loop (started by :class:`.workers.Worker`)."""
    chan, reader = become_child(parent)
    try:
        _, init = reader.get()
    except Closed:
        return
    try:
        from ..plugin.registry import REGISTRY
        REGISTRY.adopt_probes(init["probes"])  # the parent probed the third-party plugins: no second probe
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
