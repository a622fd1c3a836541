"""Request bodies of the API (pydantic; unknown keys and wrong types are refused with 422).

Bounds keep one request small whatever it holds (the body limit bounds it again). ``user`` is
accepted and ignored: the run's user is the authenticated identity."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Arg = Annotated[str, StringConstraints(max_length=100_000)]
#: Run ids as the store makes them (``r`` + 10 hex digits): nothing else reaches a path.
RUN_ID = r"^r[0-9a-f]{10}(_[0-9]{1,9})?$"
#: A run or array id, as a dependency names it.
DepId = Annotated[str, StringConstraints(pattern=RUN_ID)]


class SubmitBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    command: list[Arg] = Field(min_length=1, max_length=1000)
    project: Name
    name: Annotated[str, StringConstraints(max_length=1000)] | None = None
    gpus: int = Field(1, ge=0, le=4096)
    nodes: int = Field(1, ge=1, le=1024)
    gpu_types: list[Name] = Field(default_factory=list, max_length=64)
    gpu_fraction: float | None = Field(None, gt=0, lt=1)
    gpu_memory_mb: int | None = Field(None, gt=0, le=1 << 30)
    mig: Name | None = None
    cpu_milli: int = Field(0, ge=0, le=1 << 30)
    host_memory_mb: int = Field(0, ge=0, le=1 << 40)
    topology_key: Name | None = None
    topology_required: bool = False
    priority: Name | None = None
    max_runtime_s: float | None = Field(None, gt=0, le=10 * 365 * 86400)
    experiment: Annotated[str, StringConstraints(max_length=1000)] | None = None
    backend: Name | None = None
    preemptible: bool = True
    signal: Annotated[str, StringConstraints(pattern=r"^(SIG)?[A-Z0-9]{2,10}$")] = "SIGTERM"
    grace_s: float = Field(30.0, ge=0, le=86400)
    env: dict[Annotated[str, StringConstraints(min_length=1, max_length=1000)], Arg] = Field(
        default_factory=dict, max_length=1000
    )
    workdir: Annotated[str, StringConstraints(max_length=4096)] | None = None
    max_attempts: int | None = Field(None, ge=1, le=1000)
    #: Ignored: the run's user is the identity that submits it.
    user: str | None = Field(None, max_length=1000)
    #: Job control, as the CLI's flags (``controller.jobs``); POST /runs only.
    array: Annotated[str, StringConstraints(max_length=1000)] | None = None
    after: list[DepId] = Field(default_factory=list, max_length=1000)
    afterok: list[DepId] = Field(default_factory=list, max_length=1000)
    afternotok: list[DepId] = Field(default_factory=list, max_length=1000)
    afterany: list[DepId] = Field(default_factory=list, max_length=1000)
    after_name: list[Name] = Field(default_factory=list, max_length=100)
    hold: bool = False
    #: now+2h, an ISO time, or seconds since the epoch
    begin: Annotated[str, StringConstraints(max_length=100)] | float | None = None

    def job_fields(self) -> dict[str, object]:
        """The job control fields set (empty: a plain submit)."""
        keys = ("array", "after", "afterok", "afternotok", "afterany", "after_name", "hold",
                "begin")  # fmt: skip
        return {k: getattr(self, k) for k in keys if getattr(self, k) not in (None, [], False)}


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    runs: list[SubmitBody] = Field(min_length=1, max_length=1000)


class UpdateBody(BaseModel):
    """``PATCH /runs/{id}``: the fields to change (absent or null: unchanged)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    priority: Name | None = None
    max_runtime_s: float | None = Field(None, gt=0, le=10 * 365 * 86400)
    gpus: int | None = Field(None, ge=0, le=4096)
    gpu_types: list[Name] | None = Field(None, min_length=1, max_length=64)


class MemberBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["viewer", "member", "maintainer"]
