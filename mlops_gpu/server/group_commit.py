"""Group commit: concurrent requests' writes gathered into one store transaction.

A ``GroupCommit`` owns one writer thread. A request hands it an item (``await gc.put(item)``)
and waits; the thread takes every item waiting at that moment (up to ``max_batch``), gives them
to ``write`` in one call (one transaction), and answers each request with its own result or
exception. No timer: a batch is whatever arrived while the previous batch was committing, so a
lone request waits for nothing but its own commit, and under load the store commits once per
batch instead of once per request.

Invariants:
- A request is answered only after ``write`` returned, i.e. after the batch's transaction
  committed: a success is durable before the client hears of it (a 201 means committed).
- ``write`` returns one result per item, in order; an item's result may be an exception, which
  is raised in that request only. An exception raised by ``write`` itself fails every request
  of the batch (nothing of it was committed).
- ``close()`` lets the thread finish what was handed to it, then stops it; a ``put`` after
  ``close()`` raises ``RuntimeError``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("mlops_gpu.server")
_STOP = object()


class GroupCommit(Generic[T, R]):
    def __init__(
        self,
        write: Callable[[Sequence[T]], Sequence[R | BaseException]],
        *,
        name: str,
        max_batch: int = 256,
    ) -> None:
        self.write, self.max_batch = write, max_batch
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        #: batches written and items in them (for the benchmark's table and tests)
        self.batches = 0
        self.items = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    async def put(self, item: T) -> R:
        """``item``'s result once its batch committed (or its exception)."""
        if self._closed:
            raise RuntimeError("the server is stopping")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._q.put((item, fut, loop))
        return await fut

    def close(self, timeout: float = 30.0) -> None:
        self._closed = True
        self._q.put(_STOP)
        self._thread.join(timeout)

    def _main(self) -> None:
        while True:
            first = self._q.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._run(batch)  # type: ignore[arg-type]
            if stop:
                return

    def _run(self, batch: list[tuple[T, asyncio.Future[R], asyncio.AbstractEventLoop]]) -> None:
        results: Sequence[R | BaseException]
        try:
            results = self.write([item for item, _, _ in batch])
            if len(results) != len(batch):  # pragma: no cover - a bug in ``write``
                raise RuntimeError(f"{len(results)} results for {len(batch)} items")
        except BaseException as e:  # every request of the batch hears of it
            log.debug("group commit of %d items failed: %s", len(batch), e)
            results = [e] * len(batch)
        self.batches += 1
        self.items += len(batch)
        for (_, fut, loop), res in zip(batch, results, strict=True):
            loop.call_soon_threadsafe(_settle, fut, res)


def _settle(fut: asyncio.Future[R], res: R | BaseException) -> None:
    if fut.done():  # the request went away (client disconnected): nothing to answer
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)
