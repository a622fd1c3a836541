"""``state.pages.page_public`` (the server's ``GET /runs`` pages) against what it stands for:
``run_to_public`` of every run of ``page_runs``' pages, key for key and in the same order, for
runs of every shape (placed on one or many nodes, fractions, MIG, one or several GPU types, a
backend named, held, ended, in an array), on SQLite and PostgreSQL; and its pages are cut at
the same cursors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlops_gpu.model import Phase
from mlops_gpu.model.public import RUN_KEYS, run_to_public
from mlops_gpu.state import Store
from mlops_gpu.state.jobs import JobControl
from mlops_gpu.state.pages import page_public, page_runs
from mlops_gpu.testing import make_spec
from mlops_gpu.testing.builders import placed, placed_gang


def _fill(store: Store) -> None:
    specs = [
        make_spec("p", 1, name="plain"),
        make_spec("p", 2, name="typed", gpu_types=("a100-80gb",)),
        make_spec("q", 1, name="two-types", gpu_types=("a100-80gb", "h100"), priority="high"),
        make_spec("p", 1, name="frac", gpu_fraction=0.5, backend="local"),
        make_spec("p", 1, name="mig", mig="1g.10gb", env={"K": "v"}),
        make_spec("q", 4, 2, name="gang"),
        make_spec("p", 1, name="naïve ünïcode \u2603"),
    ]
    made = store.submit_many(specs)
    store.submit_many([make_spec("p", 1, name="held")], job=JobControl(held=True))
    store.submit_many([make_spec("p", 1, name=f"el{i}", array_index=i) for i in range(3)],
                      job=JobControl(array=True))  # fmt: skip
    by = {r.spec.name: r for r in made}
    assert store.admit(by["typed"].id, placed("n1", ["0", "1"]), now=10.0)
    assert store.admit(by["frac"].id, placed("n2", ["3"], fraction=0.5, memory_mb=4000), now=11.0)
    assert store.admit(by["gang"].id, placed_gang([("n1", ["2", "3"]), ("n3", ["0", "1"])]),
                       now=12.0)  # fmt: skip
    assert store.mark_running(by["gang"].id, now=13.0)
    assert store.finish(by["gang"].id, Phase.FAILED, "exit 3", exit_code=3, now=20.0)
    assert store.finish(by["plain"].id, Phase.CANCELLED, "cancelled", now=21.0)


Page = Callable[..., tuple[list[Any], int | None]]


def _pages(store: Store, page: Page, **kw: Any) -> list[tuple[list[Any], int | None]]:
    out: list[tuple[list[Any], int | None]] = []
    cursor = None
    while True:
        items, cursor = page(store, before_seq=cursor, limit=3, **kw)
        out.append((items, cursor))
        if cursor is None:
            return out


def test_page_public_is_run_to_public_of_page_runs(store_url: str) -> None:
    store = Store(store_url)
    try:
        _fill(store)
        kws: list[dict[str, Any]] = [{}, {"phases": [Phase.PENDING]}, {"projects": {"q"}},
                                     {"user": "tester"},
                                     {"phases": [Phase.FAILED, Phase.ADMITTED]}]  # fmt: skip
        for kw in kws:
            want = [([run_to_public(r) for r in runs], nxt)
                    for runs, nxt in _pages(store, page_runs, **kw)]  # fmt: skip
            got = _pages(store, page_public, **kw)
            assert got == want, kw
            assert all(list(d) == list(RUN_KEYS) for items, _ in got for d in items)
        everything = [d for items, _ in _pages(store, page_public) for d in items]
        assert len(everything) == 11
        # the shapes above were all met (else the comparison proves less than it says)
        assert {d["phase"] for d in everything} >= {"pending", "admitted", "failed", "cancelled"}
        assert any(d["devices"] == ["2", "3", "0", "1"] for d in everything)
        assert any(d["gpu_fraction"] == 0.5 and d["backend"] == "local" for d in everything)
        assert any(d["gpu_type"] is None and d["gpus"] == 1 and d["project"] == "q"
                   for d in everything)  # fmt: skip
    finally:
        store.close()
