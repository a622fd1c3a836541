"""``mlops-gpu metrics``: the Prometheus exposition of the cluster (``controller.prometheus``).

``--once`` prints one exposition to stdout; ``--listen HOST:PORT`` serves ``/metrics`` over HTTP
until SIGTERM or Ctrl-C (a scrape in progress is answered first): an exporter beside the
scheduler, for a Prometheus to scrape (a team's ``mlops-gpu server`` serves the same at its own
``/metrics``). It only reads the store.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6; ``:9464`` for every interface) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:9464",
                                 param_hint="--listen")  # fmt: skip
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@click.command()
@click.option("--listen", default=None, metavar="HOST:PORT", help="Serve /metrics over HTTP here.")
@click.option("--once", is_flag=True, help="Print one exposition to stdout and exit.")
@click.pass_context
def metrics(ctx: click.Context, listen: str | None, once: bool) -> None:
    """Prometheus metrics of queues, quotas, GPUs and costs (--once, or --listen HOST:PORT)."""
    from mlops_gpu.cli.common import UserError, open_runtime
    from mlops_gpu.controller.prometheus import metrics_bytes, serve

    if once == (listen is not None):
        raise UserError("give exactly one of --once and --listen HOST:PORT")
    rt = open_runtime(ctx)
    if once:
        sys.stdout.buffer.write(metrics_bytes(rt))
        sys.stdout.flush()
        return
    assert listen is not None
    host, port = parse_listen(listen)

    servers: list[Any] = []

    def _stop(_signum: int, _frame: Any) -> None:
        # Not an exception: wsgiref swallows any raised while it serves a scrape. shutdown()
        # waits for serve_forever to return, so it runs beside it, not in this handler.
        for httpd in servers:
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    def ready(httpd: Any) -> None:
        servers.append(httpd)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        h, p = httpd.server_address[:2]
        click.echo(f"serving http://{h}:{p}/metrics (Ctrl-C stops)", err=True)

    try:
        serve(rt, host, port, ready)
    except OSError as e:
        raise UserError(f"--listen {listen}: {e.strerror or e}") from None
    except KeyboardInterrupt:  # (before it was listening)
        pass
