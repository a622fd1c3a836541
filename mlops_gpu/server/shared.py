"""State the API processes of one server share: the identity cache's generation and the rate
limit's token buckets (``mlops-gpu server --workers N``: N processes, one limit and one
generation for all of them).

The memory is a small file mapped into every process (``MAP_SHARED``; on ``/dev/shm`` where
there is one): the parent makes it (``SharedState.create``) and names it to its workers in
``MLOPS_GPU_SERVER_SHARED`` (they are spawned, not forked, so the name is what travels); each
worker maps it (``SharedState.attach``). A single-process server uses anonymous memory of its
own (``SharedState.private``), with the same code.

Invariants:
- Every read and write of the memory holds this process's thread lock and then an exclusive
  ``flock`` on the file (a ``flock`` alone does not exclude threads of one process, which
  share the open file): each operation is atomic across every thread of every worker.
- The generation only grows: ``bump`` adds one and returns the new value.
- Buckets live in a fixed table of ``SLOTS`` slots: a slot is (8 bytes of the identity name's
  hash, tokens, time of the last take). An identity is looked for in the ``WINDOW`` slots
  from its hash's home slot. A slot is free when unused or when its bucket has refilled to
  ``burst`` (such a bucket is the same as a new one, so reusing it changes no answer). Only
  when ``WINDOW`` identities sharing a window are all active at once is the fullest of them
  forgotten (it starts again from a full bucket).
- Times are ``time.monotonic()``: one clock for every process of a host.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import mmap
import os
import struct
import tempfile
import threading
from pathlib import Path

ENV = "MLOPS_GPU_SERVER_SHARED"
SLOTS = 16_384
WINDOW = 64
_HEADER = 64  # the generation (int64) and room to spare
_GEN = struct.Struct("=q")
_SLOT = struct.Struct("=Qdd")  # key hash, tokens, at
SIZE = _HEADER + SLOTS * _SLOT.size


class SharedState:
    def __init__(self, mem: mmap.mmap, fd: int | None, path: Path | None) -> None:
        self._mem, self._fd, self.path = mem, fd, path
        self._lock = threading.Lock()

    @classmethod
    def private(cls) -> SharedState:
        """Memory of this process only (a server of one process)."""
        return cls(mmap.mmap(-1, SIZE), None, None)

    @classmethod
    def create(cls) -> SharedState:
        """A new file of shared state (the parent of ``--workers``); ``close(remove=True)``
        deletes it."""
        where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, name = tempfile.mkstemp(prefix="mlops-gpu-server.", dir=where)
        os.ftruncate(fd, SIZE)  # zeros: generation 0, every slot unused
        return cls(mmap.mmap(fd, SIZE), fd, Path(name))

    @classmethod
    def attach(cls, path: str | os.PathLike[str]) -> SharedState:
        """The shared state the parent made at ``path`` (a worker)."""
        fd = os.open(path, os.O_RDWR)
        return cls(mmap.mmap(fd, SIZE), fd, Path(path))

    def close(self, remove: bool = False) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._mem.close()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove and self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    # (plain acquire/release, not a context manager: this runs on every request)
    def _acquire(self) -> None:
        self._lock.acquire()
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._lock.release()
                raise

    def _release(self) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def generation(self) -> int:
        self._acquire()
        try:
            return int(_GEN.unpack_from(self._mem, 0)[0])
        finally:
            self._release()

    def bump(self) -> int:
        """The generation plus one, in every process."""
        self._acquire()
        try:
            gen = int(_GEN.unpack_from(self._mem, 0)[0]) + 1
            _GEN.pack_into(self._mem, 0, gen)
            return gen
        finally:
            self._release()

    def take(self, name: str, rate: float, burst: int, now: float) -> float:
        """Take one token from ``name``'s bucket (``rate`` per second, at most ``burst``):
        0.0 when taken, else the seconds until one is there (nothing taken)."""
        key = _hash(name)
        home = key % SLOTS
        cap = float(burst)
        self._acquire()
        try:
            spot: int | None = None  # a free slot in the window, the first seen
            fullest, most = _HEADER + home * _SLOT.size, -1.0  # to forget when none is free
            for i in range(WINDOW):
                off = _HEADER + ((home + i) % SLOTS) * _SLOT.size
                k, tokens, at = _SLOT.unpack_from(self._mem, off)
                level: float = min(cap, tokens + max(0.0, now - at) * rate)
                if k == key:
                    if level < 1.0:
                        _SLOT.pack_into(self._mem, off, key, level, now)
                        return (1.0 - level) / rate
                    _SLOT.pack_into(self._mem, off, key, level - 1.0, now)
                    return 0.0
                if spot is None and (k == 0 or level >= cap):
                    spot = off
                if level > most:
                    fullest, most = off, level
            _SLOT.pack_into(self._mem, fullest if spot is None else spot, key, cap - 1.0, now)
            return 0.0
        finally:
            self._release()


@functools.lru_cache(maxsize=65_536)
def _hash(name: str) -> int:
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1  # 0 marks an unused slot
