"""Opening a store safely: what is at the store's path is checked before anything writes to it.

Invariants:
- Only a path where nothing exists becomes a new store, and it appears there complete: it is
  built under a temporary name in the same folder and hard-linked into place (a link never
  replaces a file; a concurrent creator that linked first wins and both use its store). So no
  process ever sees a half-made store, and a 0-byte file is never one of ours.
- An existing file is inspected over a read-only connection before the store's own connections
  touch it (they switch the file to WAL, which writes its header): a file that is empty, not
  SQLite, an SQLite database of another application, damaged, or of a newer schema is refused
  with a ``StoreError`` and left byte for byte as it was. (Reading a file in WAL mode, as
  every store is, may leave its ``-wal`` and ``-shm`` beside it: those are never removed here,
  another process may be using them.)
- Database errors that mean "this store cannot be used" (damaged pages, read-only, no such
  server, bad credentials) become one ``StoreError`` line (``translate``); any other error
  (a constraint, a programming error) passes through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from mlops_gpu.state.errors import StoreError

SQLITE_HEADER = b"SQLite format 3\x00"
#: Stores up to this size get ``PRAGMA quick_check`` at every open (about 10 ms per MiB);
#: bigger ones only where ``check_pages`` asks (the scheduler's start).
QUICK_CHECK_MAX_BYTES = 8 << 20

# SQLite primary result codes (https://sqlite.org/rescode.html)
_PERM, _READONLY, _IOERR, _CORRUPT, _CANTOPEN, _FULL, _NOTADB = 3, 8, 10, 11, 14, 13, 26


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL (None: another database, or an in-memory one)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :].split("?", 1)[0]
    return None if path in ("", ":memory:") or path.startswith("file:") else path


def display(url: str) -> str:
    """The URL to show: a SQLite store as its file, any other with its password hidden."""
    path = sqlite_file(url)
    if path is not None:
        return path
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: show its scheme only, it may hold a password
        return url.split("://", 1)[0] + "://..."


class Hints:
    """What to tell the user to do, naming their config file when there is one."""

    def __init__(self, config: str | os.PathLike[str] | None) -> None:
        self.setting = f"set store: in {config}" if config else "point store: elsewhere"

    @property
    def move_away(self) -> str:
        return f"move it away (a new store is created only where no file exists) or {self.setting}"

    @property
    def restore(self) -> str:
        return (
            "restore it from a backup, or move it away to start a new store "
            "(`sqlite3 FILE .recover` may save its runs)"
        )

    @property
    def permissions(self) -> str:
        return f"make it and its folder writable by this user, or {self.setting}"

    @property
    def server(self) -> str:
        return f"check that the server is up and the URL, user and password; or {self.setting}"


def check_file(path: str, hints: Hints) -> bool:
    """Whether a store file exists at ``path``; raises ``StoreError`` for something there that
    cannot be one (not a file, empty, not SQLite, unreadable). Reads at most 100 bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StoreError(path, f"cannot be read ({e.strerror})", hints.permissions) from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(path, "is not an mlops-gpu store (not a file)", hints.move_away)
    if st.st_size == 0:
        raise StoreError(path, "is not an mlops-gpu store (an empty file)", hints.move_away)
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise StoreError(path, f"cannot be read ({e.strerror})", hints.permissions) from None
    if len(head) < 100 or not head.startswith(SQLITE_HEADER):
        raise StoreError(
            path, "is not an mlops-gpu store (file is not a database)", hints.move_away
        )
    return True


def create_new(path: str, build: Callable[[str], None], hints: Hints) -> None:
    """Make a new store at ``path`` (where nothing was): ``build`` makes it complete under a
    temporary name beside it, which is then linked into place. A file that appeared at
    ``path`` meanwhile is kept, and used."""
    folder = os.path.dirname(path) or "."
    tmp = ""
    try:
        os.makedirs(folder, exist_ok=True)
        # A fresh name that SQLite creates, so the file gets its usual mode (0644 less umask)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.new")
        build(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # a concurrent creator won: its store is as new as ours
        except OSError:  # no hard links here: claim the name, then fill it
            with contextlib.suppress(FileExistsError):
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(out, "wb") as dst, open(tmp, "rb") as src:
                    shutil.copyfileobj(src, dst)
    except OSError as e:
        raise StoreError(
            path, f"cannot be created ({e.strerror}: {e.filename or folder})", hints.permissions
        ) from None
    except DBAPIError as e:  # SQLite could not make the new file in ``folder``
        raise StoreError(path, f"cannot be created ({e.orig})", hints.permissions) from None
    finally:
        for leftover in (tmp, tmp + "-wal", tmp + "-shm", tmp + "-journal") if tmp else ():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def inspect_existing(path: str, latest: int, hints: Hints, *, check_pages: bool) -> None:
    """Refuse, over a read-only connection, an SQLite file that is not an mlops-gpu store, is
    of a newer schema than ``latest``, or (``check_pages``, or a small file) has damaged
    pages."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=120)
    except sqlite3.Error as e:
        raise _sqlite_error(path, e, hints) from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "schema_version" not in tables or "runs" not in tables:
            shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
            what = f"tables {shown}" if tables else "no tables"
            raise StoreError(
                path, f"is not an mlops-gpu store (an SQLite database with {what})", hints.move_away
            )
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        version = row[0] if row else None
        if version is None:
            raise StoreError(path, "is damaged (no schema version)", hints.restore)
        if version > latest:
            raise StoreError(
                path,
                f"was written by a newer mlops-gpu (store schema {version}, this one reads up to "
                f"{latest})",
                f"upgrade mlops-gpu, or {hints.setting}",
            )
        if check_pages or os.path.getsize(path) <= QUICK_CHECK_MAX_BYTES:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                lines = [x for x in str(problems[0]).splitlines() if x and "***" not in x]
                first = lines[0].strip() if lines else str(problems[0]).strip()
                raise StoreError(path, f"is damaged ({first})", hints.restore)
    except sqlite3.Error as e:
        raise _sqlite_error(path, e, hints) from None
    finally:
        conn.close()


def _sqlite_error(path: str, e: sqlite3.Error, hints: Hints) -> StoreError:
    code = (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF
    msg = str(e)
    if code == _NOTADB:
        return StoreError(path, f"is not an mlops-gpu store ({msg})", hints.move_away)
    if code == _CORRUPT:
        return StoreError(path, f"is damaged ({msg})", hints.restore)
    if code in (_READONLY, _PERM, _CANTOPEN):
        return StoreError(path, f"cannot be opened for writing ({msg})", hints.permissions)
    if code in (_IOERR, _FULL):
        return StoreError(path, f"cannot be written ({msg})", "free disk space, check the disk")
    return StoreError(path, f"cannot be used ({msg})", hints.restore)


_SQLITE_CODES = (_NOTADB, _CORRUPT, _READONLY, _PERM, _CANTOPEN, _IOERR, _FULL)


def classify(url: str, e: DBAPIError, hints: Hints) -> StoreError | None:
    """The ``StoreError`` a database error means, or None when it is not about the store
    being unusable (a constraint, a lock timeout, a bad statement)."""
    orig = e.orig
    if isinstance(orig, sqlite3.Error):
        code = (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _SQLITE_CODES:
            return _sqlite_error(sqlite_file(url) or url, orig, hints)
        return None
    if e.connection_invalidated or type(orig).__name__ == "OperationalError":
        reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        reason = reason.rsplit(" failed: ", 1)[-1].replace("FATAL:  ", "")
        return StoreError(display(url), f"cannot be reached ({reason})", hints.server)
    return None


@contextlib.contextmanager
def translate(url: str, hints: Hints) -> Iterator[None]:
    """Turn database errors that mean "the store cannot be used" into ``StoreError``."""
    try:
        yield
    except DBAPIError as e:
        err = classify(url, e, hints)
        if err is None:
            raise
        raise err from e
