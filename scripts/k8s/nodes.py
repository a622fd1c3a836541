"""The fake GPU nodes of scripts/k8s.sh's control plane (standard library only).

    python3 scripts/k8s/nodes.py ACTION N API_URL CERTS_DIR TIMEOUT_S

ACTION:
- ``ensure``: create the missing ``kwok-node-<i>`` (i < N), then wait until all N are Ready;
- ``check``: exit 0 iff the N nodes are Ready, 1 otherwise;
- ``unready``: mark every fake node's Ready condition Unknown (N is ignored): done before kwok
  (re)starts, so that kwok's node-initialize stage setting it back to True shows that kwok
  really manages the node (and syncs its pods).

Invariants:
- Only nodes labelled ``mlops-gpu.test/fake-node=true`` are read or changed; creation is
  idempotent (an existing node, HTTP 409, is left as it is).
- Node ``i`` is a pure function of ``i`` (``node(i)``): 8 ``nvidia.com/gpu``, 64 CPUs, 512Gi,
  InternalIP 10.240.<i/250>.<i%250+1>; even nodes A100-SXM4-80GB, odd ones H100-80GB-HBM3.
- Authenticates with the admin client certificate in CERTS_DIR and trusts only its CA.
- Progress goes to stderr; a failure exits non-zero with the API's status and message.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import time
import urllib.parse
from typing import Any

GPU_PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]
SELECTOR = "mlops-gpu.test/fake-node=true"


class Api:
    """One kept-alive HTTPS connection to kube-apiserver, reopened on a broken pipe."""

    def __init__(self, url: str, certs: str) -> None:
        self.url = urllib.parse.urlparse(url)
        self.ctx = ssl.create_default_context(cafile=f"{certs}/ca.crt")
        self.ctx.load_cert_chain(f"{certs}/admin.crt", f"{certs}/admin.key")
        self.conn: http.client.HTTPSConnection | None = None

    def req(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any]:
        for attempt in range(3):
            try:
                if self.conn is None:
                    host = self.url.hostname or "127.0.0.1"
                    self.conn = http.client.HTTPSConnection(
                        host, self.url.port, context=self.ctx, timeout=30
                    )
                data = None if body is None else json.dumps(body).encode()
                headers = {"Content-Type": ctype, "Accept": "application/json"}
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                return r.status, json.loads(r.read() or b"{}")
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")


def node(i: int) -> dict[str, Any]:
    name = f"kwok-node-{i}"
    res = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "nvidia.com/gpu": "8",
        "ephemeral-storage": "1Ti",
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "type": "kwok",
        "mlops-gpu.test/fake-node": "true",
        "nvidia.com/gpu.product": GPU_PRODUCTS[i % 2],
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.present": "true",
    }
    addresses = [
        {"type": "InternalIP", "address": f"10.240.{i // 250}.{i % 250 + 1}"},
        {"type": "Hostname", "address": name},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {},
        "status": {
            "capacity": res,
            "allocatable": dict(res),
            "addresses": addresses,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }


def nodes(api: Api) -> tuple[set[str], set[str]]:
    """The fake nodes' names, and those of them that are Ready."""
    st, body = api.req("GET", "/api/v1/nodes?labelSelector=" + urllib.parse.quote(SELECTOR))
    if st != 200:
        raise SystemExit(f"listing nodes failed: HTTP {st}: {body.get('message', body)}")
    have, ready = set(), set()
    for it in body.get("items", []):
        nm = it["metadata"]["name"]
        have.add(nm)
        for c in (it.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                ready.add(nm)
    return have, ready


def unready(api: Api, have: set[str]) -> None:
    patch = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "KwokRestarting",
                    "message": "kwok is (re)starting",
                }
            ]
        }
    }
    for nm in sorted(have):
        path = f"/api/v1/nodes/{nm}/status"
        st, body = api.req("PATCH", path, patch, "application/strategic-merge-patch+json")
        if st not in (200, 404):
            msg = body.get("message", body)
            raise SystemExit(f"marking node {nm} Ready=Unknown failed: HTTP {st}: {msg}")


def ensure(api: Api, want: set[str], have: set[str], timeout: float) -> None:
    missing = sorted(want - have, key=lambda s: int(s.rsplit("-", 1)[1]))
    if missing:
        print(f"k8s.sh: creating {len(missing)} fake GPU nodes", file=sys.stderr)
    for nm in missing:
        st, body = api.req("POST", "/api/v1/nodes", node(int(nm.rsplit("-", 1)[1])))
        if st not in (201, 409):
            raise SystemExit(f"creating node {nm} failed: HTTP {st}: {body.get('message', body)}")
    deadline = time.monotonic() + timeout
    while True:
        have, ready = nodes(api)
        if want <= ready:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"only {len(want & ready)}/{len(want)} nodes Ready after {timeout:.0f}s"
                " (is kwok running? see logs/kwok.log)"
            )
        time.sleep(0.5)
    print(f"k8s.sh: {len(want)} nodes Ready", file=sys.stderr)


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[0] not in ("ensure", "check", "unready"):
        print(__doc__, file=sys.stderr)
        return 2
    action, n, url, certs, timeout = argv[0], int(argv[1]), argv[2], argv[3], float(argv[4])
    api = Api(url, certs)
    want = {f"kwok-node-{i}" for i in range(n)}
    have, ready = nodes(api)
    if action == "check":
        return 0 if want <= ready else 1
    if action == "unready":
        unready(api, have)
        return 0
    ensure(api, want, have, timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
