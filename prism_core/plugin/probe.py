"""Trying third-party plugins in a child process before this process imports them.

A plugin runs its own code at import, in its hook and in ``availability()``; code that
segfaults, calls ``exit()``, raises ``SystemExit`` or hangs there would take down (or freeze)
whatever process imports it. So the registry first lets a child process (a *probe*) do it:
the child imports each third-party plugin in turn, calls its hook and asks each backend for
its availability, announcing every step to the parent before it takes it. The parent only
waits, with a time limit per step:

* a child that dies is blamed on the step it announced: the plugin is broken (CRASHED at
  import or in its hook), or the backend is unavailable (its ``availability()`` CRASHED), with
  the signal or exit status and, from faulthandler, the innermost frame; a fresh child
  resumes after the culprit;
* a step over the limit gets the child killed (TIMEOUT, with where it hung), likewise;
* an import that raises, ``SystemExit`` included, is reported as the registry reports it.

The parent then imports in-process only the plugins whose probe passed, and never asks a
backend whose ``availability()`` crashed or hung. One child serves every plugin unless one
misbehaves: a probe costs one interpreter start plus one per crash or hang.
"""

from __future__ import annotations

import faulthandler
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata

from ..isolation.channel import Closed, Late, send
from ..isolation.child import STARTUP_TIMEOUT, Child, become_child

DEFAULT_TIMEOUT = 60.0  # seconds per step (an import, a hook, one availability()): generous for a loaded machine
ENV_TIMEOUT = "PRISM_PLUGIN_TIMEOUT"

EntryPointSpec = tuple[str, str, str]  # (name, value, group): enough for a child to load it again


@dataclass(frozen=True)
class PluginProbe:
    """What the probe found out about one third-party plugin."""
    reason: str = ""  # why the plugin is broken ("": it can be imported in-process)
    unavailable: dict[str, str] = field(default_factory=dict)  # backend -> why (availability() crashed or hung)


def probe_timeout() -> float:
    """The time limit of one probe step: ``$PRISM_PLUGIN_TIMEOUT`` seconds (1 to 3600), else 60."""
    from ..settings import env_int
    return float(env_int(ENV_TIMEOUT, int(DEFAULT_TIMEOUT), 1, 3600))


def probe(specs: Sequence[EntryPointSpec], timeout: float) -> list[PluginProbe]:
    """Probe the plugins of ``specs`` (third-party entry points) in child processes; one
    :class:`PluginProbe` per plugin, in order."""
    state = _State(len(specs))
    while state.start < len(specs):
        child = Child("prism_core.plugin.probe", what="probe")
        try:
            fault = _run(child, list(specs), state, timeout)
        finally:
            child.kill()
        if fault is None:
            break
        step, status, detail = fault
        k = step[1]
        if step[0] == "startup":
            for j in range(k, len(specs)):
                state.reasons[j] = f"not probed: the probe process could not start: {status}: {detail}"
            break
        if step[0] == "availability":
            state.unavailable[k][step[2]] = f"availability() {status}: {detail}"
            state.asked.add((k, step[2]))
            state.start = k  # import it again and ask its other backends
        else:
            state.reasons[k] = f"{status} {_DURING[step[0]]}: {detail}"
            state.start = k + 1
    return [PluginProbe(state.reasons.get(k, ""), state.unavailable[k]) for k in range(len(specs))]


# what the plugin was doing when the probe died or hung, per step
_DURING = {"import": "while importing it", "hook": "in prism_register_backends",
           "loaded": "while loaded, between its calls (a thread of its own?)"}


class _State:
    """A probe's findings so far, kept across the children it takes."""

    def __init__(self, n: int) -> None:
        self.start = 0  # the next child starts with this plugin
        self.reasons: dict[int, str] = {}  # plugin -> why it is broken
        self.unavailable: dict[int, dict[str, str]] = {k: {} for k in range(n)}
        self.asked: set[tuple[int, str]] = set()  # (plugin, backend) whose availability() is not asked again


def _run(child: Child, specs: list[EntryPointSpec], state: _State, timeout: float) -> tuple[tuple, str, str] | None:
    """Drive one child until it is done (None) or dies or hangs: (the step it was taking,
    "CRASHED" or "TIMEOUT", how)."""
    child.send(("probe", specs, state.start, sorted(state.asked), timeout))
    step: tuple = ("startup", state.start)
    limit = STARTUP_TIMEOUT
    while True:
        try:
            msg = child.reader.get(time.monotonic() + limit)
        except Closed:
            return step, "CRASHED", child.death()
        except Late:
            where = child.hang_site()
            return step, "TIMEOUT", f"did not finish within {limit:g} s{'; it hung' + where if where else ''}"
        if msg[0] == "done":
            return None
        if msg[0] == "failed":  # the import raised: the plugin is broken, and the child goes on
            state.reasons[msg[1]] = msg[2]
        elif msg[0] == "answered":
            state.asked.add((msg[1], msg[2]))
            step = ("loaded", msg[1])
        else:
            step, limit = tuple(msg), timeout


# ------------------------------------------------------------------ the child's side
def serve(parent: int) -> None:
    """The probe process (started by :func:`probe`)."""
    chan, reader = become_child(parent)
    try:
        _, specs, start, asked, timeout = reader.get()
    except Closed:
        return
    from .registry import REGISTRY, Registry, _Entry, _label, load_plugin
    REGISTRY.sandboxed = True  # a hook that looks backends up must not start a probe of its own
    asked = {tuple(s) for s in asked}
    faulthandler.dump_traceback_later(timeout / 2, repeat=True)  # where a hang is: dumped well before the kill
    for k in range(start, len(specs)):
        ep = metadata.EntryPoint(*specs[k])
        send(chan, ("import", k))
        plugin, why = load_plugin(ep)
        if why:
            send(chan, ("failed", k, why))
            continue
        send(chan, ("hook", k))
        for c in Registry()._claims_of(_label(ep), plugin, None):  # a registry of this plugin alone: only its hook runs
            if (k, c.backend.name) in asked:
                continue
            send(chan, ("availability", k, c.backend.name))
            _Entry(c.backend, _label(ep)).state()
            send(chan, ("answered", k, c.backend.name))
    faulthandler.cancel_dump_traceback_later()
    send(chan, ("done",))
