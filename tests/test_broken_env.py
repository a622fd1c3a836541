"""Broken environments: one line naming the file and what to do, exit 1, and nothing lost.

Real SQLite files damaged the ways disks and users damage them, and the CLI as a subprocess:
every verb refuses a store file that is not one of ours (random bytes, a text file, an empty
file, an SQLite database of another application), is damaged (truncated, pages overwritten
behind a good header) or was written by a newer mlops-gpu, and leaves its bytes as they were.
A submit whose run could not be started (a state folder that cannot be written) stores no run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run_cli, stored

from mlops_gpu.state import SetupError, Store, StoreError, open_check
from mlops_gpu.testing import make_spec


def cli(cfg_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--config", str(cfg_path), *args)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of an environment failure (exit 1, nothing on stdout)."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mlops-gpu: error: ")
    assert proc.stdout == ""
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def valid_store(path: Path, runs: int = 300) -> None:
    store = Store(f"sqlite:///{path}")
    store.submit_many([make_spec(name=f"r{i}") for i in range(runs)])
    store.close()


# -- what can be at the store's path ------------------------------------------------------


def _random(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _text(path: Path) -> None:
    path.write_text("my notes, not a database\n")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    valid_store(path)
    os.truncate(path, path.stat().st_size // 2)


def _pages_damaged(path: Path) -> None:
    """A good header, schema and schema version; the pages of the ``runs`` table and its
    indexes overwritten with noise (found by their root pages: where the schema's own tables
    lie moves as the schema grows)."""
    valid_store(path)
    conn = sqlite3.connect(path)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    roots = [r[0] for r in conn.execute("SELECT rootpage FROM sqlite_master WHERE tbl_name='runs'")]
    conn.close()
    with open(path, "r+b") as f:
        for root in roots:
            f.seek((root - 1) * page)
            f.write(os.urandom(page))


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()


def _newer(path: Path) -> None:
    valid_store(path, runs=3)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()


MOVE_AWAY = "move it away (a new store is created only where no file exists) or set store: in "
KINDS = [
    pytest.param(_random, "is not an mlops-gpu store (file is not a database)", MOVE_AWAY,
                 id="random-bytes"),
    pytest.param(_text, "is not an mlops-gpu store (file is not a database)", MOVE_AWAY,
                 id="text-file"),
    pytest.param(_empty, "is not an mlops-gpu store (an empty file)", MOVE_AWAY, id="empty-file"),
    pytest.param(_foreign, "is not an mlops-gpu store (an SQLite database with tables notes)",
                 MOVE_AWAY, id="foreign-sqlite"),
    pytest.param(_truncated, "is damaged (", "restore it from a backup", id="truncated"),
    pytest.param(_pages_damaged, "is damaged (", "restore it from a backup", id="pages-damaged"),
    pytest.param(_newer, "was written by a newer mlops-gpu (store schema 99", "upgrade mlops-gpu",
                 id="newer-schema"),
]  # fmt: skip
VERBS = [
    pytest.param(["submit", "--no-start", "--project", "p", "--", "echo", "hi"], id="submit"),
    pytest.param(["queue"], id="queue"),
    pytest.param(["status"], id="status"),
    pytest.param(["scheduler", "--once"], id="scheduler"),
]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(("make", "what", "todo"), KINDS)
def test_a_bad_store_file_is_one_line_and_left_as_it_was(
    cfg_path: Path, make: Callable[[Path], None], what: str, todo: str, verb: list[str]
) -> None:
    db = cfg_path.parent / "state.db"
    make(db)
    before = digest(db)
    line = error_line(cli(cfg_path, *verb))
    assert line.startswith(f"mlops-gpu: error: {db} {what}"), line
    assert todo in line, line
    if todo == MOVE_AWAY:
        assert line.endswith(f"set store: in {cfg_path}"), line
    assert digest(db) == before  # never initialized, migrated or written
    assert not (cfg_path.parent / "state" / "runs").exists()  # and nothing was launched


def test_an_empty_store_file_is_refused_not_taken_as_a_new_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"")
    with pytest.raises(StoreError, match=r"state\.db is not an mlops-gpu store \(an empty file\)"):
        Store(f"sqlite:///{db}")
    assert db.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    # only a path where nothing exists becomes a store, complete from the first moment
    fresh = tmp_path / "sub" / "fresh.db"
    Store(f"sqlite:///{fresh}").close()
    assert fresh.read_bytes()[:16] == open_check.SQLITE_HEADER
    assert sorted(p.name for p in fresh.parent.iterdir()) == ["fresh.db"]  # no temporary left
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_damage_found_after_the_open_is_one_line_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store too big for the check at open: its damaged pages fail the read that meets them
    with the same one line (``open_check.translate``), not a database traceback."""
    db = tmp_path / "state.db"
    _pages_damaged(db)
    monkeypatch.setattr(open_check, "QUICK_CHECK_MAX_BYTES", 0)
    store = Store(f"sqlite:///{db}")
    try:
        with pytest.raises(StoreError, match=r"state\.db is damaged \(database disk image"):
            store.list_runs()
        with pytest.raises(StoreError, match=r"state\.db is damaged"):
            store.check_pages()  # what the scheduler does at its start
    finally:
        store.close()


# -- a store that is read-only ------------------------------------------------------------


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` unwritable for this process: its mode, or (root ignores modes) the immutable
    attribute; skips where neither holds."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444 if path.is_file() else 0o555)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not allowed: cannot make a file read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_store_refuses_writes_in_one_line_and_still_reads(cfg_path: Path) -> None:
    assert cli(cfg_path, "submit", "--no-start", "-p", "p", "--", "echo", "1").returncode == 0
    db = cfg_path.parent / "state.db"
    before = digest(db)
    with read_only(db):
        line = error_line(cli(cfg_path, "submit", "--no-start", "-p", "p", "--", "echo", "2"))
        assert f"{db} cannot be opened for writing (attempt to write a readonly database)" in line
        assert line.endswith(f"make it and its folder writable by this user, or set store: in "
                             f"{cfg_path}")  # fmt: skip
        assert cli(cfg_path, "status").returncode == 0
    assert digest(db) == before


# -- PostgreSQL that cannot be reached ----------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_postgres_store_is_one_line_with_the_password_hidden(
    cfg_path: Path,
) -> None:
    port = _closed_port()
    url = f"postgresql+psycopg://mg:s3cret@127.0.0.1:{port}/runs"
    cfg_path.write_text(cfg_path.read_text().replace("sqlite:///state.db", url))
    for verb in (["status"], ["submit", "--no-start", "-p", "p", "--", "echo", "hi"]):
        line = error_line(cli(cfg_path, *verb))
        assert "s3cret" not in line
        assert f"postgresql+psycopg://mg:***@127.0.0.1:{port}/runs cannot be reached (" in line
        assert "Connection refused" in line and f"set store: in {cfg_path}" in line


@pytest.mark.postgres
def test_bad_postgres_credentials_are_one_line(cfg_path: Path, postgres_url: str) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url).set(username="no_such_role", password="pw")
    cfg_path.write_text(
        cfg_path.read_text().replace(
            "sqlite:///state.db", url.render_as_string(hide_password=False)
        )
    )
    line = error_line(cli(cfg_path, "queue"))
    assert "no_such_role:***@" in line and ":pw@" not in line
    assert 'role "no_such_role" does not exist' in line


# -- a submit is atomic with the folders its run needs ------------------------------------


def _stop_schedulers(folder: Path) -> None:
    """SIGTERM a background scheduler a submit under ``folder`` started (one that logs to
    ``state/scheduler.log``; it holds the store's lease once it runs)."""
    from mlops_gpu.state.lock import current_holder

    if not (folder / "state" / "scheduler.log").is_file():
        return  # none was started
    store = Store(f"sqlite:///{folder / 'state.db'}")
    try:
        deadline = time.monotonic() + 15
        while (holder := current_holder(store)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        store.close()
    if holder is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGTERM)


@pytest.fixture
def stop_schedulers(cfg_path: Path) -> Iterator[None]:
    yield
    _stop_schedulers(cfg_path.parent)


def _state_dir_is_a_file(root: Path) -> Path:
    (root / "state").write_text("not a folder")
    return root / "state"


def _runs_folder_is_a_file(root: Path) -> Path:
    (root / "state").mkdir()
    (root / "state" / "runs").write_text("not a folder")
    return root / "state" / "runs"


def _checkpoints_folder_is_a_file(root: Path) -> Path:
    (root / "state").mkdir()
    (root / "state" / "checkpoints").write_text("not a folder")
    return root / "state" / "checkpoints"


def _scheduler_log_is_a_folder(root: Path) -> Path:
    (root / "state" / "scheduler.log").mkdir(parents=True)
    return root / "state" / "scheduler.log"


BLOCKERS = [
    pytest.param(_state_dir_is_a_file, id="state-dir-is-a-file"),
    pytest.param(_runs_folder_is_a_file, id="log-folder-is-a-file"),
    pytest.param(_checkpoints_folder_is_a_file, id="checkpoint-folder-is-a-file"),
    pytest.param(_scheduler_log_is_a_folder, id="scheduler-log-is-a-folder"),
]


@pytest.mark.usefixtures("stop_schedulers")
@pytest.mark.parametrize("block", BLOCKERS)
def test_a_submit_that_cannot_prepare_its_run_stores_none_and_a_retry_stores_one(
    cfg_path: Path, block: Callable[[Path], Path]
) -> None:
    root = cfg_path.parent
    blocker = block(root)
    line = error_line(cli(cfg_path, "submit", "--project", "p", "--", "echo", "hi"))
    assert str(blocker) in line and "no run was stored" in line, line
    assert f"set state_dir: in {cfg_path}" in line
    assert stored(cfg_path) == 0
    _stop_schedulers(root)
    # the fix, then the retry: exactly one run
    if blocker.is_dir():
        blocker.rmdir()
    else:
        blocker.unlink()
    proc = cli(cfg_path, "submit", "--no-start", "--project", "p", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert stored(cfg_path) == 1


@pytest.mark.usefixtures("stop_schedulers")
def test_an_unwritable_state_dir_stores_no_run(cfg_path: Path) -> None:
    state = cfg_path.parent / "state"
    state.mkdir()
    with read_only(state):
        line = error_line(cli(cfg_path, "submit", "--project", "p", "--", "echo", "hi"))
        assert str(state) in line and "no run was stored" in line
        assert stored(cfg_path) == 0
    proc = cli(cfg_path, "submit", "--no-start", "--project", "p", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert stored(cfg_path) == 1


@pytest.mark.parametrize("target", ["echo hi", print], ids=["command", "callable"])
def test_an_sdk_submit_into_an_unwritable_state_dir_raises_one_line_and_stores_none(
    cfg_path: Path, target: object
) -> None:
    import mlops_gpu.sdk as mg

    blocker = _state_dir_is_a_file(cfg_path.parent)
    with pytest.raises(SetupError, match=r"cannot be written .*no run was stored$") as e:
        mg.submit(target, project="p", config=cfg_path, start_scheduler=False)  # type: ignore[arg-type]
    assert "\n" not in str(e.value) and str(blocker) in str(e.value)
    assert stored(cfg_path) == 0
    blocker.unlink()
    mg.submit(target, project="p", config=cfg_path, start_scheduler=False)  # type: ignore[arg-type]
    assert stored(cfg_path) == 1


def test_a_new_store_in_a_folder_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder), pytest.raises(StoreError) as e:
        Store(f"sqlite:///{folder}/state.db")
    assert str(e.value).startswith(f"{folder}/state.db cannot be created (")
    assert "make it and its folder writable" in str(e.value) and "\n" not in str(e.value)
    assert list(folder.iterdir()) == []


def test_a_folder_at_the_store_path_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.mkdir()
    with pytest.raises(StoreError) as e:
        Store(f"sqlite:///{db}")
    assert str(e.value).startswith(f"{db} is not an mlops-gpu store (not a file): move it away")
    assert list(db.iterdir()) == []
