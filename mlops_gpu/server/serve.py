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
) -> int:
    """Serve until SIGINT/SIGTERM; the exit status. ``extras``: callables given the app before
    it serves (``create_app``), to mount more routes (e.g. ``app.mount("/metrics", ...)``)."""
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
    app = create_app(rt, thread, extras)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        log_level=log_level,
        access_log=False,
        server_header=False,
        proxy_headers=False,  # the client address is the connection's (trusted proxies: auth)
    )
    server = uvicorn.Server(config)
    try:
        # listening first: a port in use is one line and nothing started (no scheduler ran)
        sock = config.bind_socket()
    except SystemExit:
        rt.close()
        return 1
    if thread is not None:
        thread.start()
    try:
        server.run(sockets=[sock])
    finally:
        if thread is not None:
            thread.stop()
        rt.close()
    return 0 if server.started else 1
