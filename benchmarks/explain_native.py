"""``explain_all`` at the longest queue of ``core_throughput.py --core native``: the Rust engine's
explanation (``native_explain``) against the Python core's cycle on the same state (what
``NativeEngine.explain_all`` ran before), timed in process CPU time (``time.process_time``:
the machine may be shared), each the best of ``--repeat``; and both must give the same reason,
sentence and ETA for every pending run. The rest is ``core_throughput.py``'s run (its digest
must not change). The last line printed is one JSON object.

    python benchmarks/explain_native.py [--repeat 3] [core_throughput.py's options]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core_throughput

from mlops_gpu.core import cycle, cycle_explain, cycle_reserve
from mlops_gpu.core.cycle_books import CycleBooks
from mlops_gpu.core.decision import PendingReason
from mlops_gpu.core.state import State
from mlops_gpu.engines.native import NativeEngine

time.perf_counter = time.process_time  # (core_throughput's own timings: CPU time too)
measured: dict[str, float] = {}


def python_cycle(
    eng: NativeEngine, now: float, usage_history: Mapping[tuple[str, str], float] | None = None
) -> list[PendingReason]:
    """The explanation of a Python core's cycle on the engine's state (the former path)."""
    books = CycleBooks(State(eng.snapshot(now)), now, usage_history)
    cycle_reserve.work_out(books)
    cycle.schedule(books)
    return cycle_explain.explain(books)


def timed(repeat: int, f: object, *args: object) -> tuple[float, list[PendingReason]]:
    best, out = float("inf"), []
    for _ in range(repeat):
        t0 = time.process_time()
        out = f(*args)  # type: ignore[operator]
        best = min(best, time.process_time() - t0)
    return best * 1000, out


def main() -> int:
    repeat = 3
    if "--repeat" in sys.argv:
        i = sys.argv.index("--repeat")
        repeat = int(sys.argv[i + 1])
        del sys.argv[i : i + 2]
    rust = NativeEngine.explain_all

    def both(
        self: NativeEngine, now: float, usage_history: object = None, spent: object = None
    ) -> list[PendingReason]:
        ms_rust, got = timed(repeat, rust, self, now)
        ms_py, want = timed(repeat, python_cycle, self, now)
        assert {p.run_id: p for p in got} == {p.run_id: p for p in want}, "explanations differ"
        measured.update(pending=len(got), rust_ms=ms_rust, python_ms=ms_py)
        return got

    NativeEngine.explain_all = both  # type: ignore[assignment,method-assign]
    sys.argv = [sys.argv[0], "--core", "native", *sys.argv[1:]]
    rc = core_throughput.main()
    print(f"{'pending runs':24}{measured['pending']:>12}", file=sys.stderr)
    print(f"{'explain_all CPU ms':24}{'rust':>12}{'python cycle':>14}", file=sys.stderr)
    print(f"{'':24}{measured['rust_ms']:>12.1f}{measured['python_ms']:>14.1f}", file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "explain_native",
                "pending": measured["pending"],
                "explain_all_cpu_ms": round(measured["rust_ms"], 1),
                "python_cycle_cpu_ms": round(measured["python_ms"], 1),
                "same": True,
            }
        )
    )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
