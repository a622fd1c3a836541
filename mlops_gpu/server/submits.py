"""Single-run submits of concurrent requests, stored together (``group_commit``).

Each spec of a batch is checked on its own, as ``Runtime.submit_many`` checks a one-run batch
(the same ``SubmitError`` text): a bad spec fails its own request only. The good ones are
stored in one transaction (``Store.submit_many``) after their folders were proven writable, so
each request is answered after its run was committed, and a failing store fails the whole batch
with nothing stored. The inventory is read once per batch, not once per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlops_gpu.model import Run, RunSpec
from mlops_gpu.server.group_commit import GroupCommit


def submit_writer(rt: Any) -> GroupCommit[RunSpec, Run]:
    """The group commit of single-run submits into ``rt``'s store (``rt``: a ``Runtime``)."""
    from mlops_gpu.controller import SubmitError
    from mlops_gpu.controller.prepare import prepare_folders

    def write(specs: Sequence[RunSpec]) -> list[Run | BaseException]:
        nodes = rt.nodes()
        out: list[Run | BaseException | None] = [None] * len(specs)
        good: list[int] = []
        for i, spec in enumerate(specs):
            problems = rt.problems(spec, nodes)
            if problems:
                out[i] = SubmitError(f"1 of 1 runs rejected, none queued: run 0 ({spec.name}): "
                                     + "; ".join(problems))  # fmt: skip
            else:
                good.append(i)
        if good:
            chosen = [specs[i] for i in good]
            prepare_folders(rt.cfg, chosen)
            for i, run in zip(good, rt.store.submit_many(chosen), strict=True):
                out[i] = run
        return [x for x in out if x is not None]

    return GroupCommit(write, name="mlops-gpu-submits")
