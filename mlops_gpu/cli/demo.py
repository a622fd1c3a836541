"""``mlops-gpu demo``: a small cluster of virtual GPUs, three projects, a realistic mix of runs,
scheduled live by an in-process controller, then a per-project summary.

Invariants: it only writes inside its folder; it exits 0 only when every run it submitted ended
in success; on exit (normal, error or Ctrl-C) none of its runs is left running.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mlops_gpu.cli.safe_text import cell, visible
from mlops_gpu.config.starter import StarterNode, starter_config
from mlops_gpu.model import TERMINAL_PHASES, Phase, ResourceRequest, Run, RunSpec

if TYPE_CHECKING:
    from rich.table import Table

TRAIN_SCRIPT = '''\
"""A stand-in training job: prints its devices and per-epoch progress."""
import os, sys, time, math
epochs, step_s = int(sys.argv[1]), float(sys.argv[2])
print(f"devices CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
for e in range(1, epochs + 1):
    time.sleep(step_s)
    print(f"epoch {e}/{epochs} loss={2.0 * math.exp(-0.4 * e):.3f}", flush=True)
'''

# (project, name, gpus, epochs, step seconds, priority, delay before submit)
MIX = [
    ("vision", "resnet50-baseline", 1, 5, 0.8, "normal", 0.0),
    ("vision", "resnet50-augment", 1, 5, 0.8, "normal", 0.0),
    ("vision", "vit-small-2gpu", 2, 6, 0.9, "normal", 0.0),
    ("vision", "resnet50-lr-sweep", 1, 4, 0.8, "low", 0.0),
    ("nlp", "bert-finetune", 1, 5, 0.8, "normal", 0.0),
    ("nlp", "gpt-small-4gpu", 4, 6, 1.0, "normal", 0.0),
    ("nlp", "tokenizer-eval", 1, 3, 0.7, "low", 0.0),
    ("research", "rl-agent", 1, 5, 0.8, "normal", 0.0),
    ("research", "diffusion-2gpu", 2, 5, 0.9, "normal", 0.0),
    ("research", "ablation-a", 1, 4, 0.8, "low", 0.0),
    ("vision", "hotfix-eval-2gpu", 2, 3, 0.7, "high", 2.0),
    ("nlp", "distill-1gpu", 1, 4, 0.8, "normal", 1.0),
]


def write_demo_config(d: Path) -> Path:
    tracking = None if os.environ.get("MLFLOW_TRACKING_URI") else "sqlite:///mlflow.db"
    text = (
        starter_config(
            [
                StarterNode("node-a", "a100-80gb", None, 4),
                StarterNode("node-b", "a100-80gb", None, 4),
            ],
            [("vision", 4, 4), ("nlp", 2, 4), ("research", 2, 2)],
            source="mlops-gpu demo",
            tracking_uri=tracking,
            memory_gb={"a100-80gb": 80},
        )
        .replace("tick_s: 1.0", "tick_s: 0.25")
        .replace(
            "max_attempts: 3",
            "max_attempts: 3\n  backoff_s: 1.0  # the demo's runs are seconds long",
        )
    )
    cfg = d / "mlops-gpu.yaml"
    cfg.write_text(text)
    (d / "jobs").mkdir(exist_ok=True)
    (d / "jobs" / "train.py").write_text(TRAIN_SCRIPT)
    return cfg


def _last_line(rt: object, run: Run) -> str:
    from mlops_gpu.controller import Runtime

    assert isinstance(rt, Runtime)
    for b in rt.backends.values():
        for f in b.log_files(run.id, run.attempt):
            if f.name == "stdout.log":
                lines = f.read_text(errors="replace").strip().splitlines()
                return lines[-1] if lines else ""
    return ""


def _table(rt: object, runs: list[Run]) -> Table:
    from rich.table import Table

    from mlops_gpu.cli.render import _gpus

    t = Table(title="mlops-gpu demo: 2 nodes x 4 virtual a100-80gb", title_justify="left")
    for c in ("RUN", "PROJECT", "PRIORITY", "GPUS", "PHASE", "WHERE", "PROGRESS / REASON"):
        t.add_column(c, no_wrap=True)
    for r in runs:
        where = "-"
        if r.placement:
            s = r.placement.slots[0]
            where = f"{s.node}[{','.join(s.devices)}]"
        info = _last_line(rt, r) if r.phase is not Phase.PENDING else (r.reason or "")
        style = {"succeeded": "green", "failed": "red", "running": "cyan"}.get(r.phase.value, "")
        # a run's last log line is its own output: shown literally, as every name (safe_text)
        t.add_row(
            cell(r.spec.name),
            cell(r.project),
            cell(r.spec.priority),
            cell(_gpus(r)),
            cell(r.phase.value, style=style),
            cell(where),
            cell(info, limit=70),
        )
    return t


def run_demo(directory: str, scale: int = 1) -> int:
    from rich.live import Live

    from mlops_gpu.cli.render import console as make_console
    from mlops_gpu.controller import Controller, Runtime
    from mlops_gpu.controller.loop import LeaderError
    from mlops_gpu.controller.runtime import current_user

    console = make_console()
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    cfg_path = write_demo_config(d)
    rt = Runtime.load(cfg_path)

    def on_event(kind: str, run: Run | None, msg: str) -> None:
        if not console.is_terminal and run is not None:  # a log instead of the live table
            console.print(
                visible(f"{time.time() - t0:6.1f}s {kind:<10} {run.id} {run.spec.name}: {msg}"),
                soft_wrap=True,
                highlight=False,
                markup=False,
            )

    ctl = Controller(rt, on_event=on_event)
    try:
        ctl.acquire()
    except LeaderError as e:
        console.print(
            visible(f"mlops-gpu: error: {e} (stop it, or use another --dir)"), markup=False
        )
        return 1
    t0 = time.time()
    user = current_user()
    mix = sorted(MIX * scale, key=lambda m: m[6])
    ids: list[str] = []
    pending_mix = list(mix)
    live = (
        Live(console=console, refresh_per_second=4, transient=False, auto_refresh=False)
        if console.is_terminal
        else None
    )
    ok = False
    try:
        if live:
            live.start()
        while True:
            while pending_mix and time.time() - t0 >= pending_mix[0][6]:
                proj, name, gpus, epochs, step, prio, _ = pending_mix.pop(0)
                spec = RunSpec(
                    name=name,
                    project=proj,
                    user=user,
                    command=(sys.executable, str(d / "jobs" / "train.py"), str(epochs), str(step)),
                    request=ResourceRequest(gpus=gpus),
                    priority=prio,
                    # an honest estimate (2x the expected time), as backfill and ETAs use it
                    max_runtime_s=2 * epochs * step + 10,
                    workdir=str(d),
                )
                run = rt.submit(spec)
                ids.append(run.id)
                if not live:
                    console.print(
                        f"{time.time() - t0:6.1f}s submitted  {run.id} {name}: "
                        f"{proj}, {gpus} GPU, priority {prio}",
                        highlight=False,
                    )
            ctl.tick()
            runs = [r for r in (rt.store.get(i) for i in ids) if r is not None]
            if live:
                live.update(_table(rt, runs), refresh=True)
            if not pending_mix and all(r.phase in TERMINAL_PHASES for r in runs):
                ok = all(r.phase is Phase.SUCCEEDED for r in runs)
                break
            if time.time() - t0 > 300:
                console.print("mlops-gpu: error: the demo did not finish within 300 s")
                break
            time.sleep(rt.cfg.scheduler.tick_s)
    except KeyboardInterrupt:
        console.print("interrupted: cancelling the demo's runs")
    finally:
        if live:
            live.stop()
        _drain(rt, ctl, ids)
        ctl.release()
    wall = time.time() - t0
    _summary(console, rt, ids, wall)
    cfg_arg = f"--config {cfg_path}"
    console.print(
        f"\nDone in {wall:.1f} s ({'all runs succeeded' if ok else 'NOT all runs succeeded'})."
        " Look at the results:\n"
        f"  mlops-gpu {visible(cfg_arg)} report      # GPU-hours, cost, queue wait per project\n"
        f"  mlops-gpu {visible(cfg_arg)} status\n"
        f"  mlops-gpu {visible(cfg_arg)} logs {ids[0] if ids else 'RUN_ID'}\n"
        f"  {visible(mlflow_ui_hint(rt.cfg.tracking_uri(dict(os.environ))))}\n"
        f"Config, state store and run logs are in {visible(d)}",
        soft_wrap=True,
        highlight=False,
        markup=False,  # the paths are the user's (--dir): shown as typed
    )
    return 0 if ok else 1


def mlflow_ui_hint(uri: str) -> str:
    """How to see the demo's MLflow runs: the UI command for a local store, else the server."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser   # the MLflow server with the runs"
    return (
        f"mlflow ui --backend-store-uri {uri}   # the MLflow runs, then open http://127.0.0.1:5000"
    )


def _drain(rt: object, ctl: object, ids: list[str]) -> None:
    """Cancel whatever of ours still runs and tick until it has ended (nothing left running)."""
    from mlops_gpu.controller import Controller, Runtime

    assert isinstance(rt, Runtime) and isinstance(ctl, Controller)
    for i in ids:
        r = rt.store.get(i)
        if r is not None and r.phase not in TERMINAL_PHASES:
            rt.store.request_cancel(i)
    deadline = time.time() + 60
    while time.time() < deadline:
        runs = [rt.store.get(i) for i in ids]
        if all(r is None or r.phase in TERMINAL_PHASES for r in runs):
            return
        ctl.tick()
        time.sleep(0.2)


def _summary(console: object, rt: object, ids: list[str], wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from mlops_gpu.controller import Runtime

    assert isinstance(console, Console) and isinstance(rt, Runtime)
    runs = [r for r in (rt.store.get(i) for i in ids) if r is not None]
    usage = [u for u in rt.store.usage() if u.run_id in set(ids)]
    capacity_gpus = sum(n.capacity for n in rt.nodes())
    t = Table(title="Per-project summary", title_justify="left")
    preempted = {r.id: sum(e.kind == "preempted" for e in rt.store.events(r.id)) for r in runs}
    for c in (
        "PROJECT",
        "RUNS",
        "SUCCEEDED",
        "PREEMPTED",
        "GPU-HOURS",
        "MEAN QUEUE WAIT",
        "ALLOCATED UTIL",
    ):
        t.add_column(c, justify="right" if c != "PROJECT" else "left")
    available = capacity_gpus * wall
    for proj in sorted({r.project for r in runs}):
        pr = [r for r in runs if r.project == proj]
        gpu_s = sum(u.gpu_seconds for u in usage if u.project == proj)
        # queue wait, as ``report`` and MLflow's mlops_gpu.queue_wait_s define it: per attempt,
        # from joining the queue (submit or requeue) to admission
        waits = [u.start - u.queued_at for u in usage if u.project == proj and u.queued_at]
        t.add_row(
            cell(proj),
            str(len(pr)),
            str(sum(r.phase is Phase.SUCCEEDED for r in pr)),
            str(sum(preempted[r.id] for r in pr)),
            f"{gpu_s / 3600:.4f}",
            f"{sum(waits) / len(waits):.1f} s" if waits else "-",
            f"{gpu_s / available:.0%}" if available else "-",
        )
    total = sum(u.gpu_seconds for u in usage)
    t.add_row(
        "all",
        str(len(runs)),
        str(sum(r.phase is Phase.SUCCEEDED for r in runs)),
        str(sum(preempted.values())),
        f"{total / 3600:.4f}",
        "",
        f"{total / available:.0%}" if available else "-",
    )
    console.print(t)
    console.print(
        "Allocated utilization = GPU-time allocated / GPU-time available over the demo "
        f"({capacity_gpus} GPUs x {wall:.1f} s); virtual GPUs have no device utilization.\n"
        "Queue wait = per attempt, admission minus the time it joined the queue (its submit or "
        "requeue): the same as `report`'s mean_wait_s and MLflow's mlops_gpu.queue_wait_s."
    )
