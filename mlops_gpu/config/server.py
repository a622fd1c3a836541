"""The config's ``server`` section (``mlops-gpu server``) and project membership roles.

Invariants:
- ``auth.mode`` ``token`` (default): a request is identified by an API token only. ``proxy``:
  also by ``auth.proxy_header``, but only on a connection from one of ``auth.trusted_proxies``
  (a header from any other address is ignored, never trusted).
- Limits are bounded: a body limit of 1 KiB .. 1 GiB (a callable's: 1 KiB .. 4 GiB), a rate
  of at least one request a second.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: A project role, lowest first: ``viewer`` reads, ``member`` also submits and cancels its own
#: runs, ``maintainer`` also cancels any run of the project.
ProjectRole = Literal["viewer", "member", "maintainer"]
ROLE_RANK: dict[str, int] = {"viewer": 1, "member": 2, "maintainer": 3}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class AuthConfig(_Strict):
    mode: Literal["token", "proxy"] = "token"
    #: The header a trusted proxy (oauth2-proxy, an ingress with SSO) sets to the user's name.
    proxy_header: str = Field("X-Auth-Request-Email", min_length=1, max_length=200)
    #: Addresses (or networks, ``10.0.0.0/8``) of the proxies whose header is believed.
    trusted_proxies: list[str] = Field(default_factory=list)
    #: Days a token made by ``mlops-gpu users add`` stays valid (``--expires`` overrides).
    token_days: float = Field(90.0, gt=0, le=36500)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"expected an IP address or network, got {item!r}") from None
        return v


class ServerConfig(_Strict):
    auth: AuthConfig = Field(default_factory=AuthConfig)
    #: Largest request body accepted, in bytes (413 beyond).
    max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 1 << 20
    #: Largest pickled Python callable (with its arguments) a submit may carry, in bytes
    #: (``POST /api/v1/runs/call``; 413 beyond). Only that route takes bodies this large.
    max_call_bytes: Annotated[int, Field(ge=1024, le=1 << 32)] = 64 << 20
    #: Requests per second per identity (a burst of ``rate_burst``); 429 with Retry-After
    #: beyond. null: no limit.
    rate_per_s: float | None = Field(50.0, ge=1)
    rate_burst: int = Field(200, ge=1)
