"""Single-run submits of concurrent requests, stored together (``group_commit``).

Each spec of a batch is checked on its own, as ``Runtime.submit_many`` checks a one-run batch
(the same ``SubmitError`` text): a bad spec fails its own request only. The good ones are
stored in one transaction (``Store.submit_many``) after their folders were proven writable, so
each request is answered after its run was committed, and a failing store fails the whole batch
with nothing stored. The inventory is read once per batch, not once per request.

An item may carry its request's audit row (``Submit.audit``, from ``fast_submit``): it is
stored in the transaction of its run, with the run's id as target, so a 201 means the run and
its audit row are both committed, and the audit trail costs no transaction of its own. An item
whose spec is refused stores no row here (its request answers the error and audits it).

Folders are proven per backend a spec names (``prepare_folders`` of that spec alone, once per
batch for each backend name): a run whose backend's folder cannot be written fails its own
request with the ``SetupError`` (503, as a lone submit), and the rest of the batch is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlops_gpu.model import Run, RunSpec
from mlops_gpu.server.group_commit import GroupCommit


@dataclass(frozen=True, slots=True)
class Submit:
    spec: RunSpec
    #: the request's ``audit.entry_row`` (status 201), stored with the run; None: the request
    #: is audited by ``AuditTrail`` after its answer (the FastAPI route)
    audit: dict[str, Any] | None = None


def submit_writer(rt: Any) -> GroupCommit[Submit, Run]:
    """The group commit of single-run submits into ``rt``'s store (``rt``: a ``Runtime``)."""
    from mlops_gpu.controller import SubmitError
    from mlops_gpu.controller.prepare import prepare_folders
    from mlops_gpu.state import SetupError

    def write(items: Sequence[Submit]) -> list[Run | BaseException]:
        specs = [item.spec for item in items]
        nodes = rt.nodes()
        out: list[Run | BaseException | None] = [None] * len(specs)
        good: list[int] = []
        # backend name (None: any) -> its folders' SetupError, or None once proven writable
        folders: dict[str | None, SetupError | None] = {}
        for i, spec in enumerate(specs):
            problems = rt.problems(spec, nodes)
            if problems:
                out[i] = SubmitError(f"1 of 1 runs rejected, none queued: run 0 ({spec.name}): "
                                     + "; ".join(problems))  # fmt: skip
                continue
            if spec.backend not in folders:
                try:
                    prepare_folders(rt.cfg, [spec])
                    folders[spec.backend] = None
                except SetupError as e:
                    folders[spec.backend] = e
            failed = folders[spec.backend]
            if failed is not None:
                out[i] = SetupError(str(failed))  # (one exception object per request)
            else:
                good.append(i)
        if good:
            chosen = [specs[i] for i in good]
            rows = [items[i].audit for i in good]
            stored = rt.store.submit_many(chosen, audit=rows)
            for i, run in zip(good, stored, strict=True):
                out[i] = run
        return [x for x in out if x is not None]

    return GroupCommit(write, name="mlops-gpu-submits")
