"""Admission: ``n_slots`` requests compute at once, up to ``n_queue`` more wait; beyond, a request is refused
(the server answers 503 with Retry-After)."""

from __future__ import annotations

import asyncio


class QueueFull(Exception):
    pass


class Slots:
    def __init__(self, n_slots: int, n_queue: int) -> None:
        self.n_slots, self.n_queue = n_slots, n_queue
        self.active = 0
        self.waiting = 0
        self._cond: asyncio.Condition | None = None

    def _c(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def acquire(self) -> None:
        c = self._c()
        async with c:
            if self.active < self.n_slots:
                self.active += 1
                return
            if self.waiting >= self.n_queue:
                raise QueueFull
            self.waiting += 1
            try:
                await c.wait_for(lambda: self.active < self.n_slots)
                self.active += 1
            finally:
                self.waiting -= 1

    async def release(self) -> None:
        c = self._c()
        async with c:
            self.active -= 1
            c.notify()
