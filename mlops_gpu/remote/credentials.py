"""The server a client talks to and its token: from the environment or from the credentials
file ``mlops-gpu login`` writes (JSON ``{"url", "token"}``, created with mode 0600 and never
widened; a file others can read is refused, as ssh refuses such a key)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    url: str
    token: str


class CredentialsError(ValueError):
    """A credentials file that cannot be used (one line naming it)."""


def credentials_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mlops-gpu" / "credentials"


def load(environ: Mapping[str, str] | None = None) -> Target | None:
    path = credentials_path(environ)
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(f"{path}: readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                               f"`chmod 600 {path}` or log in again")  # fmt: skip
    try:
        data = json.loads(path.read_text())
        return Target(str(data["url"]), str(data["token"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CredentialsError(f"{path}: not a credentials file ({e}); run `mlops-gpu login` "
                               "again") from None  # fmt: skip


def save(t: Target, environ: Mapping[str, str] | None = None) -> Path:
    path = credentials_path(environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".credentials.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, json.dumps({"url": t.url, "token": t.token}).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def target(config: str | None, environ: Mapping[str, str] | None = None) -> Target | None:
    """The server to talk to, or None for local mode (``config``: the ``--config`` given)."""
    env = os.environ if environ is None else environ
    url = env.get("MLOPS_GPU_URL")
    if url:
        token = env.get("MLOPS_GPU_TOKEN")
        if not token:
            stored = load(env)
            token = stored.token if stored is not None else None
        if not token:
            raise CredentialsError("MLOPS_GPU_URL is set but no token: set MLOPS_GPU_TOKEN or "
                                   "run `mlops-gpu login URL --token TOKEN`")  # fmt: skip
        return Target(url.rstrip("/"), token)
    if config or env.get("MLOPS_GPU_CONFIG"):
        return None
    return load(env)
