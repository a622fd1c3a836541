"""Elastic pools on Kubernetes: the standard way to show an autoscaler (Karpenter,
cluster-autoscaler) demand is pods it cannot place, so a node the scale decision wants is asked
for with one **placeholder pod** per node, and the autoscaler's nodes take the runs once up.

A placeholder (``placeholder_manifest``) requests a whole node's GPUs (the pool's
``gpus_per_node`` of ``nvidia.com/gpu``), selects the pool's nodes by the label
``mlops-gpu/pool=<pool>`` (the NodePool's or node group's template label), runs a pause
container and has the ``mlops-gpu-placeholder`` PriorityClass (negative value, never preempts)
so that it never blocks real work. kube-scheduler finds no node for it and marks it
Unschedulable, the autoscaler provisions a node for it, and kube-scheduler binds it there.

A pool's nodes as the scale decision sees them (``pool_nodes``, pure):
- a node labelled ``mlops-gpu/pool=<pool>`` of the pool's GPU type: ``up`` when schedulable,
  ``booting`` (ready about now) when it is registering (NotReady, or Karpenter's
  ``karpenter.sh/unregistered`` taint); cordoned or being removed by the autoscaler
  (``karpenter.sh/disrupted``): no state (out of the pool);
- a placeholder not bound to such a node: a ``booting`` slot ``<pool>/new-<i>``, ready at its
  ask time plus ``boot_s``;
- up to ``max_nodes`` in all, the rest are ``powered_down`` slots ``<pool>/new-<i>`` (nodes the
  autoscaler could add); booting one means creating its placeholder.

Removal (``settle``, before the core's cycle): a placeholder bound to a pool node that is up is
deleted at once, so the core's runs (pinned by ``nodeName``, which bypasses kube-scheduler) can
take the GPUs it held. Its node is offered to the core only once the deletion is confirmed
(``releasing``: a later list no longer has the pod, not even terminating): until then a real
kubelet still counts the placeholder's GPUs, and a run pinned there would be refused
(``OutOfnvidia.com/gpu``) and lost. Meanwhile the node is listed unschedulable with the reason
``RELEASING``, which ``pool_nodes`` reads as booting (ready now), so nobody asks for another
node in its place. A node
newly up that no placeholder is bound to yet replaces the oldest pending one, which is deleted
(else, once the core filled the node, kube-scheduler would find no room for it and the
autoscaler would add another node). One
that no node took within ``boot_s`` plus the grace is deleted too (the next decision may ask
again). Scaling down is the autoscaler's: Karpenter's ``consolidationPolicy: WhenEmpty``
after ``consolidateAfter`` (set it near the pool's ``idle_s``), cluster-autoscaler's
scale-down-unneeded time.

Invariants: placeholders carry ``app.kubernetes.io/component=capacity-placeholder`` and
``mlops-gpu/pool``, ``mlops-gpu/slot`` labels and are the only pods this module creates or
deletes; at most one placeholder per slot, and at most ``max_nodes`` nodes and placeholders per
pool. The API is called through the backend's rate-limited helpers, and its reads are one
list of the namespace's placeholders per tick, whatever the number of pools (``settle``).

Why the placeholders share the backend's token bucket (``rate_limit``) with its launches
rather than having a budget of their own: ``api_qps``/``api_burst`` is what this client promises
the API server, all calls together (as client-go's limit is per client); a second bucket would
let the backend exceed it by that bucket's rate. Sharing cannot starve launches: the
controller's tick calls ``settle`` and ``ask`` before it launches, in the same thread, and the
launches of a tick are done before the next tick's ``settle`` (``controller.launch`` waits for
its threads), so the two never queue for tokens at the same time; and a tick's placeholder calls
are bounded (one list, plus at most ``max_nodes`` creates or deletes per pool, and those only
when nodes come or go), where its launches are one call per run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlops_gpu.backends.k8s_manifest import GPU_RESOURCE, MANAGED_BY, dns_label, label_value
from mlops_gpu.model import Node, NodeState, Pool, PoolNode

log = logging.getLogger("mlops_gpu.backends")

POOL_LABEL = "mlops-gpu/pool"
SLOT_LABEL = "mlops-gpu/slot"
COMPONENT = "capacity-placeholder"
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY},app.kubernetes.io/component={COMPONENT}"
PRIORITY_CLASS = "mlops-gpu-placeholder"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
RUNS_ANNOTATION = "mlops-gpu/runs"
ASKED_ANNOTATION = "mlops-gpu/asked-at"
#: Taints with which Karpenter marks a node that is not (or no longer) taking pods.
STARTING_TAINT = "karpenter.sh/unregistered"
#: A pool node's ``state_reason`` while a placeholder still holds its GPUs (``releasing``).
RELEASING = "a capacity placeholder is leaving it"
LEAVING_TAINT = "karpenter.sh/disrupted"
#: How long past ``boot_s`` a placeholder waits for a node before it is deleted.
GRACE_S = 60.0
_SLOT = re.compile(r"(.+)/new-(\d+)\Z")


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str
    pool: str  # the pool label value
    slot: int
    asked_at: float
    node: str | None  # where kube-scheduler bound it (None: pending)
    runs: tuple[str, ...] = ()


def slot_name(pool: str, i: int) -> str:
    return f"{pool}/new-{i}"


def parse_slot(name: str) -> tuple[str, int] | None:
    """``("gpu", 3)`` for ``"gpu/new-3"``; None for a node's name."""
    m = _SLOT.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def pool_nodes(
    pool: Pool, nodes: Sequence[Node], held: Sequence[Placeholder], now: float
) -> list[PoolNode]:
    """The pool's nodes and slots in their states (the module docstring's rules)."""
    want = label_value(pool.name)
    out: list[PoolNode] = []
    real: set[str] = set()
    for n in sorted(nodes, key=lambda n: n.name):
        if n.labels.get(POOL_LABEL) != want or n.gpu_type != pool.gpu_type:
            continue
        if n.schedulable:
            out.append(PoolNode(n.name, pool.name, NodeState.UP))
        elif n.state_reason in ("NotReady", "registering", RELEASING):
            out.append(PoolNode(n.name, pool.name, NodeState.BOOTING, ready_at=now))
        else:
            continue  # cordoned, or the autoscaler is removing it
        real.add(n.name)
    used: set[int] = set()
    for p in sorted(held, key=lambda p: p.slot):
        if p.pool != want:
            continue
        used.add(p.slot)
        if p.node is not None and p.node in real:
            continue  # its node is listed itself
        out.append(PoolNode(slot_name(pool.name, p.slot), pool.name, NodeState.BOOTING,
                            ready_at=p.asked_at + pool.boot_s))  # fmt: skip
    i = 0
    while len(out) < pool.max_nodes:
        if i not in used:
            out.append(PoolNode(slot_name(pool.name, i), pool.name, NodeState.POWERED_DOWN))
        i += 1
    return out


def placeholder_manifest(
    pool: Pool, slot: int, runs: Sequence[str], now: float, namespace: str, priority: bool
) -> dict[str, Any]:
    """The placeholder pod asking for one node of ``pool`` (for ``runs``), as a plain dict."""
    gpus = str(pool.gpus_per_node)
    spec: dict[str, Any] = {
        "nodeSelector": {POOL_LABEL: label_value(pool.name)},
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "placeholder",
            "image": PAUSE_IMAGE,
            "resources": {"requests": {GPU_RESOURCE: gpus}, "limits": {GPU_RESOURCE: gpus}},
        }],
    }  # fmt: skip
    if priority:
        spec["priorityClassName"] = PRIORITY_CLASS
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            # the time in the name: a deleted placeholder's name may still be taken
            "name": f"mlops-gpu-capacity-{dns_label(pool.name, 30)}-{slot}-{int(now * 1000)}",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": MANAGED_BY,
                "app.kubernetes.io/component": COMPONENT,
                POOL_LABEL: label_value(pool.name),
                SLOT_LABEL: str(slot),
            },
            "annotations": {RUNS_ANNOTATION: ",".join(runs), ASKED_ANNOTATION: f"{now:.3f}"},
        },
        "spec": spec,
    }


def parse_placeholder(pod: Mapping[str, Any]) -> Placeholder | None:
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    if meta.get("deletionTimestamp"):
        return None  # on its way out
    try:
        slot, asked = int(labels[SLOT_LABEL]), float(notes[ASKED_ANNOTATION])
    except (KeyError, ValueError):
        return None
    runs = tuple(r for r in str(notes.get(RUNS_ANNOTATION, "")).split(",") if r)
    node = (pod.get("spec") or {}).get("nodeName") or None
    return Placeholder(meta["name"], str(labels.get(POOL_LABEL, "")), slot, asked, node, runs)


#: The backend's helpers: ``get(what, fn, *args, **kw) -> dict`` and ``send(...)``.
Call = Callable[..., Any]


class Placeholders:
    """A Kubernetes backend's placeholder pods (its ``capacity``)."""

    def __init__(self, clients: Callable[[], Any], get: Call, send: Call, namespace: str) -> None:
        self._clients, self._get, self._send = clients, get, send
        self.namespace = namespace
        self._held: list[Placeholder] | None = None
        self._priority: bool | None = None  # whether the PriorityClass exists (None: unknown)
        #: pool -> its nodes up at the last ``settle`` (None before the first)
        self._seen: dict[str, set[str] | None] = {}
        #: the tick (its ``now``) of the last list by ``settle``: one list a tick for all pools
        self._listed_at: float | None = None
        #: placeholder -> its node, for those deleted while bound whose pod was still listed
        #: (or not listed since): their node's GPUs may still be held by the kubelet
        self._leaving: dict[str, str] = {}

    def held(self, refresh: bool = False) -> list[Placeholder]:
        """The placeholders in the namespace (listed once per ``settle``, then kept current by
        this object's own creates and deletes)."""
        if self._held is None or refresh:
            core, _, _ = self._clients()
            items = self._get("list placeholder pods", core.list_namespaced_pod, self.namespace,
                              label_selector=SELECTOR)["items"]  # fmt: skip
            self._held = [p for p in map(parse_placeholder, items) if p is not None]
            listed = {str((i.get("metadata") or {}).get("name")) for i in items}  # terminating too
            self._leaving = {k: v for k, v in self._leaving.items() if k in listed}
        return list(self._held)

    def releasing(self) -> set[str]:
        """The nodes whose GPUs a placeholder may still hold: one is bound there (as last
        listed), or one deleted there was listed since (terminating) or not listed since. No
        API call: ``settle``'s list is what confirms a deletion."""
        bound = {p.node for p in self._held or () if p.node is not None}
        return bound | set(self._leaving.values())

    def pool_nodes(self, pool: Pool, nodes: Sequence[Node], now: float) -> list[PoolNode]:
        return pool_nodes(pool, nodes, self.held(), now)

    def settle(self, pool: Pool, nodes: Sequence[Node], now: float) -> None:
        """Delete the pool's placeholders whose node is up, or that waited too long. A node
        newly up with no placeholder bound yet takes the oldest pending one's place: the core
        may fill it this cycle, and kube-scheduler would then find no room for that placeholder,
        which would have the autoscaler add a node nobody needs."""
        up = {n.name for n in nodes
              if n.schedulable and n.labels.get(POOL_LABEL) == label_value(pool.name)}  # fmt: skip
        seen = self._seen.setdefault(pool.name, None)
        fresh = up - seen if seen is not None else set()  # (none on the first look)
        self._seen[pool.name] = up
        listed = self.held(refresh=self._listed_at != now)  # (kept current since, this tick)
        self._listed_at = now
        mine = [p for p in listed if p.pool == label_value(pool.name)]
        fresh -= {p.node for p in mine}
        pending = sorted((p for p in mine if p.node is None), key=lambda p: (p.asked_at, p.slot))
        for node, p in zip(sorted(fresh), pending, strict=False):
            self._delete(p, f"node {node} came up for the pool")
        gone = {p.name for p in pending[: len(fresh)]}
        for p in mine:
            if p.name in gone:
                continue
            if p.node is not None and p.node in up:
                self._delete(p, f"its node {p.node} is up")
            elif now - p.asked_at > pool.boot_s + GRACE_S:
                # pending, or bound to a node that never became schedulable (NotReady,
                # cordoned): kept, it would hold that node up (the autoscaler's consolidation
                # never removes a node with a pod on it)
                log.warning("pool %s: no node came up for placeholder %s within %.0f s; "
                            "deleting it (see the autoscaler's log)", pool.name, p.name,
                            pool.boot_s + GRACE_S)  # fmt: skip
                self._delete(p, "no node came up")

    def forget_others(self, pools: Iterable[Pool]) -> bool:
        """Delete the placeholders of pools no longer acted on here (removed or renamed in the
        config, or moved to another backend): no ``settle`` would ever look at them again, and
        a kept one holds its node (and its cost) up. True (done; a cluster error raises)."""
        names = {label_value(p.name) for p in pools}
        for p in self.held(refresh=True):
            if p.pool not in names:
                self._delete(p, f"its pool {p.pool} is no longer in the config")
        return True

    def ask(self, pool: Pool, slots: Mapping[str, Sequence[str]], now: float) -> None:
        """Create a placeholder for each powered-down slot in ``slots`` (slot -> runs)."""
        held = {(p.pool, p.slot) for p in self.held()}
        core, _, _ = self._clients()
        for name in sorted(slots):
            parsed = parse_slot(name)
            if parsed is None or (label_value(pool.name), parsed[1]) in held:
                continue
            pod = placeholder_manifest(pool, parsed[1], slots[name], now, self.namespace,
                                       self._has_priority_class())  # fmt: skip
            self._send("create placeholder pod", core.create_namespaced_pod, self.namespace, pod)
            assert self._held is not None
            self._held.append(parse_placeholder(pod) or _never())
            log.info("pool %s: asked the autoscaler for a node (placeholder %s, runs %s)",
                     pool.name, pod["metadata"]["name"], ",".join(slots[name]) or "-")  # fmt: skip

    def _delete(self, p: Placeholder, why: str) -> None:
        core, _, _ = self._clients()
        try:
            self._send("delete placeholder pod", core.delete_namespaced_pod, p.name,
                       self.namespace, grace_period_seconds=0)  # fmt: skip
        except RuntimeError as e:  # (the backend's API error, with the HTTP status)
            if getattr(e, "status", 0) != 404:  # 404: gone already
                raise
        log.info("placeholder %s deleted: %s", p.name, why)
        if p.node is not None:
            self._leaving[p.name] = p.node
        if self._held is not None:
            self._held = [h for h in self._held if h.name != p.name]

    def _has_priority_class(self) -> bool:
        """Create the placeholders' PriorityClass once (value -10, ``preemptionPolicy:
        Never``); where that is not allowed, placeholders go without it (priority 0)."""
        if self._priority is None:
            core, _, client = self._clients()
            api = client.SchedulingV1Api(core.api_client)
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": PRIORITY_CLASS},
                "value": -10,
                "preemptionPolicy": "Never",
                "globalDefault": False,
                "description": "mlops-gpu capacity placeholders: below every real pod",
            }
            try:
                self._send("create priority class", api.create_priority_class, body)
                self._priority = True
            except RuntimeError as e:
                self._priority = getattr(e, "status", 0) == 409  # exists already
                if not self._priority:
                    log.warning("placeholders go without PriorityClass %s: %s", PRIORITY_CLASS, e)
        return self._priority


def _never() -> Placeholder:  # pragma: no cover (a manifest of ours always parses)
    raise AssertionError("placeholder manifest does not parse")
