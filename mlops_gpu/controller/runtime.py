"""``Runtime``: a validated config with its store and backends, and the submit path every edge
(CLI, SDK, plugins) shares."""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from mlops_gpu.backends import Backend
from mlops_gpu.backends.k8s_capacity import POOL_LABEL
from mlops_gpu.backends.k8s_manifest import label_value
from mlops_gpu.config import Config, load_config
from mlops_gpu.controller.backend_build import make_backend
from mlops_gpu.core import request_problems
from mlops_gpu.model import Node, ResourceRequest, Run, RunSpec
from mlops_gpu.model.submit import NAME_FROM_COMMAND, SubmitRequest, run_spec
from mlops_gpu.state import Store
from mlops_gpu.state.errors import DependencyError
from mlops_gpu.state.jobs import JobControl


class SubmitError(ValueError):
    """A run that cannot be queued; nothing was written."""


class Runtime:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @staticmethod
    def load(path: str | os.PathLike[str] | None = None) -> Runtime:
        return Runtime(load_config(path))

    @cached_property
    def store(self) -> Store:
        # A missing SQLite file (and its folder) is created; anything else at the path is
        # checked first, and a store that cannot be used is a one-line StoreError.
        return Store(self.cfg.store_url, config=self.cfg.source)

    @cached_property
    def backends(self) -> Mapping[str, Backend]:
        return {name: make_backend(self.cfg, name) for name in self.cfg.backends}

    def nodes(self) -> list[Node]:
        return [n for b in self.backends.values() for n in b.inventory()]

    def problems(self, spec: RunSpec, nodes: list[Node] | None = None) -> list[str]:
        """What is wrong with ``spec`` for this config and inventory (``nodes``: the
        inventory, when the caller has read it already)."""
        from mlops_gpu.config.pools import acted_on

        listed = self.nodes() if nodes is None else nodes
        pools = {n: self.cfg.pools[n] for n in acted_on(self.cfg.pools, self.cfg.backends)
                 if self.cfg.pools[n].backend in self.cfg.backends}  # fmt: skip
        # A pool's nodes count even while none is up: on Kubernetes the autoscaler's nodes do
        # not exist until a placeholder asks for them (Slurm lists powered-down ones), so each
        # pool adds the nodes it may still add (up to max_nodes, with those listed): a gang
        # asked of an empty pool is judged by what the pool can become, not by what is up.
        shapes = [
            Node(f"{name}/new-{i}", p.backend, p.gpu_type,
                 tuple(str(d) for d in range(p.gpus_per_node)), schedulable=False,
                 state_reason="a node the pool can add")
            for name, p in pools.items()
            for i in range(p.max_nodes - sum(self._in_pool(n, name) for n in listed))
        ]  # fmt: skip
        out = request_problems(
            spec,
            projects=self.cfg.model_projects(),
            gpu_types=self.cfg.model_gpu_types(),
            priority_classes=self.cfg.priority_classes,
            nodes=[*listed, *shapes],
            backends=self.cfg.backends,
            capabilities={n: b.capabilities for n, b in self.backends.items()},
        )
        req = spec.request
        limits = [f"pool {name} has at most max_nodes {p.max_nodes} of {p.gpus_per_node} GPUs"
                  for name, p in sorted(pools.items())
                  if req.accepts(p.gpu_type) and spec.backend in (None, p.backend)
                  and req.gpus <= p.gpus_per_node]  # fmt: skip
        if limits and req.nodes > 1:  # why a gang too big for the pools is refused
            out = [f"{x} ({'; '.join(limits)})" if x.startswith("nodes:") else x for x in out]
        return out

    def _in_pool(self, node: Node, pool: str) -> bool:
        """Whether a listed node is one of ``pool``'s: of its backend and GPU type and, on
        Kubernetes, labelled with the pool (``k8s_capacity.POOL_LABEL``; Slurm lists a pool's
        powered-down nodes too, with no label)."""
        p = self.cfg.pools[pool]
        if node.backend != p.backend or node.gpu_type != p.gpu_type:
            return False
        if getattr(self.cfg.backends.get(p.backend), "type", "") != "kubernetes":
            return True
        return node.labels.get(POOL_LABEL) == label_value(pool)

    def spec(
        self,
        command: tuple[str, ...],
        *,
        project: str,
        name: str | None = None,
        priority: str | None = None,
        request: ResourceRequest | None = None,
        user: str | None = None,
        **fields: Any,
    ) -> RunSpec:
        """A run spec the way every edge builds one: the current user (``user``: the
        authenticated identity of a server request instead), the config's default class, the
        command as its name when it has none. ``fields``: other ``RunSpec`` fields."""
        return RunSpec(
            name=name or " ".join(command)[:NAME_FROM_COMMAND],
            project=project,
            user=user if user is not None else current_user(),
            command=command,
            request=request or ResourceRequest(),
            priority=priority or self.cfg.default_priority,
            **fields,
        )

    def spec_of(self, req: SubmitRequest, user: str | None = None) -> RunSpec:
        """The spec a local edge (CLI, SDK, Prefect worker) queues for ``req`` (``run_spec``):
        the current user unless ``user``, this config's default class, this process's
        working directory unless it names one."""
        user = user if user is not None else current_user()
        return run_spec(req, user=user, default_priority=self.cfg.default_priority, cwd=os.getcwd())

    def submit(self, spec: RunSpec, *, start_scheduler: bool = False) -> Run:
        """Validate ``spec`` against the config and inventory, then queue it (``_store``)."""
        problems = self.problems(spec)
        if problems:
            raise SubmitError("; ".join(problems))
        return self._store([spec], start_scheduler)[0]

    def submit_many(
        self, specs: list[RunSpec], *, start_scheduler: bool = False, job: JobControl | None = None
    ) -> list[Run]:
        """Validate every spec, then queue them all in one store transaction, or none: the
        SubmitError names each bad spec by its position and name. ``job``: an array, a hold,
        dependencies by name (``controller.jobs``)."""
        nodes = self.nodes()
        bad = []
        # an array's elements differ only in their index: one stands for all
        for i, spec in enumerate(specs[:1] if job is not None and job.array else specs):
            problems = self.problems(spec, nodes)
            if problems:
                bad.append(f"run {i} ({spec.name}): " + "; ".join(problems))
        if bad:
            if job is not None and job.array:  # the elements differ only in their index
                raise SubmitError(bad[0].split(": ", 1)[1])
            raise SubmitError(
                f"{len(bad)} of {len(specs)} runs rejected, none queued: " + " | ".join(bad)
            )
        return self._store(specs, start_scheduler, job)

    def _store(
        self, specs: list[RunSpec], start_scheduler: bool, job: JobControl | None = None
    ) -> list[Run]:
        """Store the runs last, so that a failing submit stores none (``prepare``): the store
        opened, the runs' folders proven writable, a background scheduler started if asked
        (one started for nothing exits when idle), then the runs' rows written."""
        from mlops_gpu.controller.daemon import ensure_scheduler
        from mlops_gpu.controller.prepare import prepare_folders

        store = self.store
        prepare_folders(self.cfg, specs)
        if start_scheduler:
            ensure_scheduler(self)
        try:
            return store.submit_many(specs, job=job)
        except DependencyError as e:
            raise SubmitError(str(e)) from None

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()


def current_user() -> str:
    try:
        return os.environ.get("MLOPS_GPU_USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return str(os.getuid())
