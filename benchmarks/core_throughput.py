"""Scheduling-core throughput: 1,000 nodes x 8 GPUs (3 GPU types), 50,000 runs in 20 projects
and 4 cohorts, mixed 1/2/4/8-GPU and 2-node gang requests, all queued at time 0, durations
log-uniform in [10 min, 10 h] (seeded), max_runtime = 2 x duration. On a virtual clock a
scheduling cycle runs at every completion time until every run has run.

Reports whole-cycle times, admissions per second of cycle time, a full explanation pass (a
reason and ETA for every pending run) at the longest queue (``explain_all_ms``: the median of
five passes, each the same work as nothing is applied), peak RSS, and, in the same run, a
naive FIFO first-fit baseline on the same workload. The last line printed is one JSON object.

    python benchmarks/core_throughput.py [--nodes 1000] [--runs 50000] [--seed 1]
                                         [--core auto|native|python] [--arrays]
                                         [--setup default|rich] [--clock wall|cpu]
                                         [--placement best-fit|fragmentation]
                                         [--shortest-preempt-borrowers]
                                         [--preempt-uncheckpointed]

``--arrays`` (job control): the runs come in job arrays of 100 (one project, type and shape
each) limited to 8 running at once (``%8``), and 10% of runs depend (``afterok``) on a run of
an earlier array; the engine runs behind the job control gate (``engines.gated``). In the same run
the same engine schedules the same runs without job control (``plain_admissions_per_s``).

``--setup rich`` (``_rich_setup``): the same nodes and runs, where a quarter of the nodes are
MIG-partitioned or shared, runs carry topology labels and host CPU and memory, and 5 projects
have budgets (what they spent is handed to every cycle). It runs ``placement: best-fit``
unless ``--placement`` says otherwise (``--placement fragmentation``: the shipped default,
which weighs its MIG, shared and host-tracking nodes); without ``--placement`` each set-up
keeps its own (the default set-up's: the shipped default).

``--clock cpu`` times cycles and the explanation by the process's CPU time
(``time.process_time``) instead of the wall clock: on a shared machine the neighbours' load
then does not count.

The Python core is the reference, a snapshot per cycle (``engines.reference.FromScratch``;
``--engine incremental`` and ``from-scratch``, kept for old command lines, both run it). The
core: ``native`` is the engine in Rust (``mlops_gpu.engines.native`` over ``mlops_gpu._engine``,
built by ``pip install`` where cargo exists), ``python`` the Python core; ``auto``, the
default, is native where it is installed and says so on stderr where it is not.
The JSON's ``engine`` is the engine that decided (``native`` or ``python``; ``core`` says the
same, its former name) and ``mode`` the ``--engine`` option. ``decisions_sha256`` digests every
cycle's admissions (run, nodes, devices) and preemptions, so
two runs that print the same digest decided alike: both cores print the same.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import random
import resource
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from types import MappingProxyType

import _rich_setup

from mlops_gpu.core import PolicySettings, Snapshot
from mlops_gpu.engines.gated import Gated
from mlops_gpu.engines.native import PYTHON_ENGINE_WARNING, NativeEngine, installed
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import (
    BackendCapabilities,
    Cohort,
    Dependency,
    GpuType,
    Node,
    Phase,
    Project,
    Quota,
    ResourceRequest,
    Run,
    RunSpec,
)

TYPES = {"a100-80gb": 0.4, "h100-80gb": 0.4, "l40s-48gb": 0.2}
#: `explain_all_ms`: the median of this many calls at the longest queue
EXPLAIN_TIMES = 5
SHAPES = [((1, 1), 0.40), ((2, 1), 0.20), ((4, 1), 0.15), ((8, 1), 0.15), ((4, 2), 0.10)]


ARRAY_SIZE, ARRAY_LIMIT, DEPENDENT = 100, 8, 0.10


def with_job_control(runs: list[Run], seed: int) -> list[Run]:
    """``--arrays``: consecutive runs of ``ARRAY_SIZE`` become one array (its first run's
    request and project for all, ``%ARRAY_LIMIT``); ``DEPENDENT`` of the runs depend on a run
    of an earlier array (``afterok``)."""
    rng = random.Random(seed + 1)
    out = []
    for k, run in enumerate(runs):
        g, first = k // ARRAY_SIZE, runs[k - k % ARRAY_SIZE]
        deps: tuple[Dependency, ...] = ()
        if g > 0 and rng.random() < DEPENDENT:
            deps = (Dependency("afterok", runs[rng.randrange(g * ARRAY_SIZE)].id),)
        spec = replace(
            run.spec,
            project=first.spec.project,
            request=first.spec.request,
            array_id=f"a{g:04d}",
            array_index=k % ARRAY_SIZE,
            array_limit=ARRAY_LIMIT,
            dependencies=deps,
        )
        out.append(replace(run, spec=spec))
    return out


def workload(
    n_nodes: int, n_runs: int, seed: int, order: str = "shortest", setup: str = "default"
) -> tuple[Snapshot, list[Run], dict[str, float]]:
    if setup == "rich":
        return _rich_setup.workload(n_nodes, n_runs, seed, order, TYPES, SHAPES)
    rng = random.Random(seed)
    nodes, i = [], 0
    for t, share in TYPES.items():
        for _ in range(round(n_nodes * share)):
            nodes.append(Node(f"node-{i:04d}", "sim", t, tuple(str(d) for d in range(8))))
            i += 1
    cap = defaultdict(int)
    for n in nodes:
        cap[n.gpu_type] += n.capacity
    projects = {}
    for p in range(20):
        quotas = {t: Quota(c // 20, None) for t, c in cap.items()}
        projects[f"p{p:02d}"] = Project(
            f"p{p:02d}", cohort=f"c{p % 4}", quotas=MappingProxyType(quotas)
        )
    template = Snapshot(
        now=0.0,
        nodes=tuple(nodes),
        pending=(),
        active=(),
        projects=projects,
        gpu_types={t: GpuType(t, 2.0) for t in TYPES},
        priority_classes={"normal": 100},
        cohorts={f"c{c}": Cohort(f"c{c}") for c in range(4)},
        policy=PolicySettings(order=order),
        capabilities={"sim": BackendCapabilities(multi_node=True)},
    )
    runs, durations = [], {}
    shapes, weights = zip(*SHAPES, strict=True)
    for k in range(n_runs):
        gpus, width = rng.choices(shapes, weights)[0]
        gpu_type = rng.choices(list(TYPES), list(TYPES.values()))[0]
        duration = math.exp(rng.uniform(math.log(600), math.log(36000)))
        rid = f"r{k:05d}"
        spec = RunSpec(
            name=rid,
            project=f"p{rng.randrange(20):02d}",
            user="bench",
            command=("true",),
            request=ResourceRequest(gpus, width, (gpu_type,)),
            priority="normal",
            max_runtime_s=2 * duration,
        )
        runs.append(Run(rid, k, spec, Phase.PENDING, 1, 0.0))
        durations[rid] = duration
    return template, runs, durations


def simulate(
    engine: object,
    runs: list[Run],
    durations: dict[str, float],
    explain_at_longest: bool,
    spending: _rich_setup.Spending | None = None,
) -> dict[str, float | str]:
    """Drive ``engine`` (submit / cycle / finish) on a virtual clock; time the cycles.
    ``spending``: what budgeted projects spent, handed to every cycle and explanation."""
    digest = hashlib.sha256()
    for r in runs:
        engine.submit(r)  # type: ignore[attr-defined]
    ends: list[tuple[float, str]] = []
    now, cycle_s, admitted, preempted = 0.0, [], 0, 0
    explain_ms, explained = None, set()
    while True:
        spent = None if spending is None else {"spent": spending.spent(now)}
        t0 = time.perf_counter()
        d = engine.cycle(now, **(spent or {}))  # type: ignore[attr-defined]
        cycle_s.append(time.perf_counter() - t0)
        if explain_at_longest and explain_ms is None:  # the queue is longest after cycle 1
            # the median of EXPLAIN_TIMES calls (each the same work: nothing is applied); one
            # call on a shared machine varied from 92 to 136 ms between two runs
            times = []
            for _ in range(EXPLAIN_TIMES):
                t1 = time.perf_counter()
                reasons = engine.explain_all(now, **(spent or {}))  # type: ignore[attr-defined]
                times.append((time.perf_counter() - t1) * 1000)
            explain_ms = statistics.median(times)
            # (every pending run but those a cycle at ``now`` would still admit: in the rich
            # set-up a reservation the first cycle kept can let a run in at the same instant)
            explained = {p.run_id for p in reasons}
            assert len(explained) == len(reasons) and explained <= engine.pending.keys()  # type: ignore[attr-defined]
        digest.update(repr((now, [(a.run_id, a.placement.slots) for a in d.admissions],
                            [p.run_id for p in d.preemptions])).encode())  # fmt: skip
        for a in d.admissions:
            admitted += 1
            heapq.heappush(ends, (now + durations[a.run_id], a.run_id))
        for p in d.preemptions:  # the simulated job stops at once and queues again
            preempted += 1
            victim = engine.finish(p.run_id)  # type: ignore[attr-defined]  # (no end: requeued)
            engine.submit(
                replace(
                    victim,
                    phase=Phase.PENDING,
                    placement=None,  # type: ignore[attr-defined]
                    preempt_requested=False,
                    attempt=victim.attempt + 1,
                )
            )
        if not ends:
            break
        now, rid = heapq.heappop(ends)
        done = [rid]
        while ends and ends[0][0] <= now:
            done.append(heapq.heappop(ends)[1])
        done = [r for r in done if r in engine.active]  # type: ignore[attr-defined]
        for rid in done:
            ended = engine.finish(rid)  # type: ignore[attr-defined]
            if spending is not None:
                spending.ended_run(ended, now, durations[rid])
        if isinstance(engine, Gated):  # their dependents may start
            engine.ended_many((rid, Phase.SUCCEEDED) for rid in done)
    cycle_s.sort()
    total = sum(cycle_s)
    return {
        "admitted": admitted,
        "preempted": preempted,
        "cycles": len(cycle_s),
        "cycle_wall_s": total,
        "admissions_per_s": admitted / total if total else 0.0,
        "p50_cycle_ms": cycle_s[len(cycle_s) // 2] * 1000,
        "p99_cycle_ms": cycle_s[min(len(cycle_s) - 1, int(len(cycle_s) * 0.99))] * 1000,
        "explain_all_ms": explain_ms or 0.0,
        "explained": len(explained),
        "decisions_sha256": digest.hexdigest(),
    }


class NaiveFifo:
    """The baseline: strict submit order, first fit, stop at the first run that does not fit."""

    def __init__(self, template: Snapshot) -> None:
        self.free = {n.name: n.capacity for n in template.nodes}
        self.by_type: dict[str, list[str]] = defaultdict(list)
        for n in template.nodes:
            self.by_type[n.gpu_type].append(n.name)
        self.queue: list[Run] = []
        self.head = 0
        self.active: dict[str, list[tuple[str, int]]] = {}

    def submit(self, run: Run) -> None:
        self.queue.append(run)

    def finish(self, run_id: str) -> None:
        for node, g in self.active.pop(run_id):
            self.free[node] += g

    def cycle(self, now: float) -> object:
        from mlops_gpu.core import Admission, Decision
        from mlops_gpu.model import NodeSlot, Placement

        out = []
        while self.head < len(self.queue):
            run = self.queue[self.head]
            req = run.request
            chosen = [n for n in self.by_type[req.gpu_types[0]] if self.free[n] >= req.gpus]
            if len(chosen) < req.nodes:
                break
            slots = chosen[: req.nodes]
            for n in slots:
                self.free[n] -= req.gpus
            self.active[run.id] = [(n, req.gpus) for n in slots]
            out.append(
                Admission(
                    run.id,
                    Placement("sim", req.gpu_types[0], tuple(NodeSlot(n, ()) for n in slots)),
                )
            )
            self.head += 1
        return Decision(admissions=tuple(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--engine", choices=["incremental", "from-scratch"], default="incremental")
    ap.add_argument(
        "--order",
        choices=["shortest", "submit", "las"],
        default="shortest",
        help="the policy's order within a project (default: the shipped default)",
    )
    ap.add_argument(
        "--core",
        choices=["auto", "native", "python", "installed"],
        default="auto",
        help="native: the engine in Rust (mlops_gpu._engine, built by pip install where cargo "
        "exists); python (or its former name, installed): the Python core; auto (default): "
        "native where installed, else python",
    )
    ap.add_argument(
        "--arrays", action="store_true", help="arrays of 100 with %%8; 10%% of runs depend"
    )
    ap.add_argument(
        "--setup",
        choices=["default", "rich"],
        default="default",
        help="rich: MIG and shared nodes, topology, host CPU and memory, budgets (_rich_setup)",
    )
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: time by the process's CPU time (time.process_time), for a shared machine",
    )
    ap.add_argument(
        "--shortest-preempt-borrowers",
        action="store_true",
        help="policy.shortest_preempt_borrowers on (under shortest: long runs of borrowing "
        "cohort members are victims too)",
    )
    ap.add_argument(
        "--preempt-uncheckpointed",
        action="store_true",
        help="policy.preempt_uncheckpointed on (the workload's runs never report a checkpoint: "
        "without it no run of a preemptor's class is ever a victim)",
    )
    ap.add_argument(
        "--placement",
        choices=["best-fit", "fragmentation"],
        default=None,
        help="the policy's placement (default: the set-up's own; rich: best-fit)",
    )
    args = ap.parse_args()
    if args.setup == "rich" and args.arrays:
        raise SystemExit("core_throughput: --setup rich is not combined with --arrays")
    if args.clock == "cpu":
        time.perf_counter = time.process_time
    template, runs, durations = workload(args.nodes, args.runs, args.seed, args.order, args.setup)
    if args.shortest_preempt_borrowers or args.preempt_uncheckpointed:
        template = replace(
            template,
            policy=replace(
                template.policy,
                shortest_preempt_borrowers=args.shortest_preempt_borrowers,
                preempt_uncheckpointed=args.preempt_uncheckpointed,
            ),
        )
    if args.placement is not None:
        template = replace(template, policy=replace(template.policy, placement=args.placement))
    plain_runs = runs
    if args.arrays:
        runs = with_job_control(runs, args.seed)
    module = None
    if args.core in ("auto", "native") and args.engine == "incremental":
        module = installed()
        if module is None:
            if args.core == "native":
                raise SystemExit(f"core_throughput: {PYTHON_ENGINE_WARNING}")
            print(f"core_throughput: {PYTHON_ENGINE_WARNING}; measuring the Python core",
                  file=sys.stderr)  # fmt: skip
    elif args.core == "native":
        raise SystemExit(
            "core_throughput: --engine from-scratch runs the Python reference; with --core "
            "native leave --engine out"
        )
    core = "native" if module is not None else "python"

    def new_engine() -> object:
        if module is not None:
            return NativeEngine(template, module)
        return make_engine(args.engine, template)

    engine = Gated(new_engine()) if args.arrays else new_engine()
    print(
        f"core_throughput: {len(template.nodes)} nodes, {args.runs} runs, engine {args.engine}, "
        f"core {core} ...",
        file=sys.stderr,
    )
    spending = _rich_setup.Spending(template) if args.setup == "rich" else None
    ours = simulate(engine, runs, durations, explain_at_longest=True, spending=spending)
    plain = simulate(new_engine(), plain_runs, durations, False) if args.arrays else None
    base = simulate(NaiveFifo(template), plain_runs, durations, explain_at_longest=False)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "bench": "core_throughput",
        "setup": args.setup,
        "engine": core,
        "mode": args.engine,
        "core": core,
        "clock": args.clock,
        "shortest_preempt_borrowers": template.policy.shortest_preempt_borrowers,
        "preempt_uncheckpointed": template.policy.preempt_uncheckpointed,
        "placement": template.policy.placement,
        "nodes": len(template.nodes),
        "gpus": sum(n.capacity for n in template.nodes),
        "runs": args.runs,
        "admissions_per_s": round(ours["admissions_per_s"], 1),
        "p50_cycle_ms": round(ours["p50_cycle_ms"], 3),
        "p99_cycle_ms": round(ours["p99_cycle_ms"], 3),
        "explain_all_ms": round(ours["explain_all_ms"], 1),
        "explained": ours["explained"],
        "peak_rss_mb": round(rss_mb, 1),
        "baseline_admissions_per_s": round(base["admissions_per_s"], 1),
        "cycles": ours["cycles"],
        "preemptions": ours["preempted"],
        "cycle_wall_s": round(ours["cycle_wall_s"], 2),
        "baseline_cycle_wall_s": round(base["cycle_wall_s"], 2),
        "decisions_sha256": ours["decisions_sha256"],
    }
    if plain is not None:
        out["arrays"] = {"size": ARRAY_SIZE, "limit": ARRAY_LIMIT, "dependent": DEPENDENT}
        out["plain_admissions_per_s"] = round(plain["admissions_per_s"], 1)
        out["plain_cycle_wall_s"] = round(plain["cycle_wall_s"], 2)
        print(f"{'plain (no job control)':24}{out['plain_admissions_per_s']:>12} admissions/s",
              file=sys.stderr)  # fmt: skip
    print(f"{'':24}{'ours':>12}{'naive FIFO':>14}", file=sys.stderr)
    print(
        f"{'admissions/s':24}{out['admissions_per_s']:>12}{out['baseline_admissions_per_s']:>14}",
        file=sys.stderr,
    )
    print(
        f"{'cycle wall s':24}{out['cycle_wall_s']:>12}{out['baseline_cycle_wall_s']:>14}",
        file=sys.stderr,
    )
    print(
        f"{'p50 / p99 cycle ms':24}{out['p50_cycle_ms']:>6}/{out['p99_cycle_ms']:<6}",
        file=sys.stderr,
    )
    print(f"{'explain all ms':24}{out['explain_all_ms']:>12}", file=sys.stderr)
    print(json.dumps(out))
    return 0


def make_engine(name: str, template: Snapshot) -> object:
    """The Python core's engine (``name``: either ``--engine``; both are the reference now)."""
    return FromScratch(template)


if __name__ == "__main__":
    sys.exit(main())
