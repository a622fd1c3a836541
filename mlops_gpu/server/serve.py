"""Running the server: the app on uvicorn (TLS when given a certificate and key), with the
control loop in a thread beside it unless ``scheduler`` is False. SIGINT/SIGTERM stop uvicorn,
then the loop (after its tick; the lease is given up, so another server takes over at once)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any


def serve(
    rt: Any,
    *,
    host: str,
    port: int,
    certfile: str | None = None,
    keyfile: str | None = None,
    scheduler: bool = True,
    log_level: str = "info",
    extras: Iterable[Callable[[Any], None]] = (),
    workers: int = 1,
) -> int:
    """Serve until SIGINT/SIGTERM; the exit status. ``extras``: callables given the app before
    it serves (``create_app``), to mount more routes (e.g. ``app.mount("/metrics", ...)``;
    one process only). ``workers`` > 1: that many API processes (``worker``) on one socket,
    the scheduler in this one."""
    import uvicorn

    from mlops_gpu.controller.service import SchedulerThread
    from mlops_gpu.server.app import create_app

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")  # fmt: skip
    _ = rt.store  # opened (and migrated) before the first request: a bad store fails the start
    thread = None
    if scheduler:
        from mlops_gpu.controller import Runtime

        sched = Runtime(rt.cfg)
        # the loop's writes are fenced by the lease, the API's never: a Store of its own, on
        # the same engine (``Store.twin``: not a second open of the file in this process)
        sched.__dict__["store"] = rt.store.twin()
        thread = SchedulerThread(sched)
    common: dict[str, Any] = dict(
        host=host,
        port=port,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        log_level=log_level,
        access_log=False,
        server_header=False,
        proxy_headers=False,  # the client address is the connection's (trusted proxies: auth)
    )
    if workers > 1:
        return _serve_workers(rt, thread, workers, common)
    config = uvicorn.Config(create_app(rt, thread, extras), **common)
    freeze_heap()
    server = uvicorn.Server(config)
    if not _run_bound(rt, thread, config, lambda sock: server.run(sockets=[sock])):
        return 1
    return 0 if server.started else 1


def freeze_heap() -> None:
    """Move what is alive once the app is built (the modules of FastAPI, SQLAlchemy, pydantic,
    the config) out of the garbage collector's reach: its full passes walk every tracked
    object, and those hundreds of thousands of start-up objects, never garbage, made each
    pass cost tens of milliseconds of some unlucky request's latency."""
    import gc

    gc.collect()
    gc.freeze()


def _run_bound(rt: Any, thread: Any, config: Any, run: Callable[[Any], None]) -> bool:
    """Listen on ``config``'s socket, then start the scheduler ``thread`` (if any) and
    ``run(socket)`` until it returns; the store is closed either way. False when the socket
    could not be bound: a port in use is one line (uvicorn's) and nothing started."""
    try:
        sock = config.bind_socket()
    except SystemExit:
        rt.close()
        return False
    if thread is not None:
        thread.start()
    try:
        run(sock)
    finally:
        if thread is not None:
            thread.stop()
        rt.close()
    return True


def _serve_workers(rt: Any, thread: Any, workers: int, common: dict[str, Any]) -> int:
    import os

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from mlops_gpu.server import shared, worker
    from mlops_gpu.server.dashboard import session

    if rt.cfg.source is None:
        print("mlops-gpu server: --workers needs a config file (--config)", file=sys.stderr)
        rt.close()
        return 1
    # the workers are spawned: they read the config file this process was given
    os.environ[worker.ENV_CONFIG] = str(rt.cfg.source)
    os.environ[worker.ENV_SCHEDULER] = "1" if thread is not None else "0"
    # one dashboard CSRF key for every worker (a form may be posted to another worker)
    os.environ.setdefault(session.ENV_SECRET, os.urandom(32).hex())
    # one rate limit and one identity cache generation for every worker
    state = shared.SharedState.create()
    os.environ[shared.ENV] = str(state.path)
    config = uvicorn.Config("mlops_gpu.server.worker:app", factory=True, workers=workers,
                            **common)  # fmt: skip
    try:
        bound = _run_bound(rt, thread, config, lambda s: Multiprocess(config, sockets=[s]).run())
    finally:
        state.close(remove=True)
    return 0 if bound else 1
