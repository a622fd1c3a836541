"""Reading Slurm's answers: ``sinfo --json``, ``squeue --json``, ``scontrol show job`` and
``sacct -c`` (job completion records), into plain values. Pure functions, no I/O.

Facts (Slurm 22.05 and later): ``--json`` output ignores the command's filters, so callers
filter here; a job leaves ``squeue`` and ``scontrol`` ``MinJobAge`` seconds after it ended, and
then only the completion record (jobcomp) knows how it ended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlops_gpu.backends.base import JobState

#: Slurm job states -> ours. A job the scheduler stopped ends CANCELLED (the controller knows
#: it asked); NODE_FAIL, BOOT_FAIL and PREEMPTED are the cluster's doing: the run is lost.
STATES = {
    "PENDING": JobState.STARTING,
    "CONFIGURING": JobState.STARTING,
    "REQUEUED": JobState.STARTING,
    "REQUEUE_HOLD": JobState.STARTING,
    "RESIZING": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "NODE_FAIL": JobState.LOST,
    "BOOT_FAIL": JobState.LOST,
    "PREEMPTED": JobState.LOST,
    "REVOKED": JobState.LOST,
}
#: Why a job ended, in the words the controller reads (``JobStatus.reason``).
REASONS = {
    "CANCELLED": "stopped",
    "TIMEOUT": "max_runtime",
    "NODE_FAIL": "its node failed",
    "BOOT_FAIL": "its node failed to boot",
    "PREEMPTED": "Slurm preempted it",
    "OUT_OF_MEMORY": "out of memory",
}
_DOWN = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "FUTURE", "MAINTENANCE",
         "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED", "UNKNOWN",
         "INVALID", "PLANNED"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    gres: dict[str, int]  # GPU GRES type -> count
    schedulable: bool
    reason: str
    #: Base state and flags, upper case (``IDLE``, ``CLOUD``, ``POWERED_DOWN``, ...).
    words: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class SlurmJobInfo:
    job_id: str
    name: str
    state: str  # Slurm's word: RUNNING, COMPLETED, ...
    exit_code: int | None = None
    signal: int | None = None
    start: float | None = None
    end: float | None = None
    nodes: str = ""
    #: why a pending job waits (squeue's ``state_reason``: ``Resources``, ``ReqNodeNotAvail``...)
    reason: str = ""
    #: the nodes it was pinned to (``--nodelist``), as a Slurm host list
    required: str = ""

    @property
    def ours(self) -> JobState:
        return STATES.get(self.state, JobState.LOST)


def gpu_gres(gres: str) -> dict[str, int]:
    """``"gpu:a100:8(S:0),tmpdisk:100"`` -> ``{"a100": 8}``; an untyped ``gpu:4`` -> ``{"": 4}``."""
    out: dict[str, int] = {}
    for part in (gres or "").split(","):
        part = re.sub(r"\(.*?\)", "", part.strip())
        bits = part.split(":")
        if not bits or bits[0] != "gpu" or len(bits) < 2:
            continue
        count = bits[-1]
        gtype = bits[1] if len(bits) >= 3 else ""
        if count.isdigit():
            out[gtype] = out.get(gtype, 0) + int(count)
    return out


def _words(v: Any) -> list[str]:
    if isinstance(v, str):
        return [w for w in re.split(r"[+,\s]+", v.upper()) if w]
    if isinstance(v, list):
        return [str(w).upper() for w in v]
    return []


def parse_sinfo(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes of ``sinfo --json``, each once (sinfo lists a node per partition)."""
    seen: dict[str, SlurmNode] = {}
    for n in doc.get("nodes", []):
        name = str(n.get("name") or n.get("hostname") or "")
        if not name or name in seen:
            continue
        states = set(_words(n.get("state"))) | set(_words(n.get("state_flags")))
        reason = str(n.get("reason") or "")
        # A node powering up (power saving) does not respond until it is up, and Slurm holds the
        # jobs it is allocated until then: it takes runs.
        down = sorted(states & _DOWN - ({"NOT_RESPONDING"} if "POWERING_UP" in states else set()))
        why = ", ".join(w.lower() for w in down) + (f": {reason}" if reason and down else "")
        gres = gpu_gres(str(n.get("gres") or ""))
        seen[name] = SlurmNode(name, gres, not down, why, frozenset(states))
    return list(seen.values())


def _num(v: Any) -> float | None:
    """A number from Slurm's JSON, which wraps some as ``{"set", "infinite", "number"}``."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    return float(v) if isinstance(v, int | float) else None


def _exit(v: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from Slurm's ``exit_code``: in 22.05 the raw wait status (exit 3 is
    768, killed by signal 15 is 15); in newer versions a ``{return_code, signal}`` struct."""
    if isinstance(v, dict):
        rc = _num(v.get("return_code"))
        sig = v.get("signal") or {}
        signo = _num(sig.get("id") if isinstance(sig, dict) else sig)
        return (None if rc is None else int(rc)), (int(signo) if signo else None)
    n = _num(v)
    if n is None:
        return None, None
    status = int(n)
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def parse_squeue(
    doc: Mapping[str, Any], job_ids: Iterable[str] | None = None
) -> dict[str, SlurmJobInfo]:
    """Jobs of ``squeue --json`` by id (only ``job_ids`` when given)."""
    want = None if job_ids is None else set(job_ids)
    out: dict[str, SlurmJobInfo] = {}
    for j in doc.get("jobs", []):
        jid = str(j.get("job_id"))
        if want is not None and jid not in want:
            continue
        state = j.get("job_state")
        word = (_words(state) or ["UNKNOWN"])[0]
        code, sig = _exit(j.get("exit_code"))
        start, end = _num(j.get("start_time")), _num(j.get("end_time"))
        out[jid] = SlurmJobInfo(
            jid, str(j.get("name", "")), word, code, sig,
            start or None, end or None, str(j.get("nodes", "")),
            str(j.get("state_reason") or ""), str(j.get("required_nodes") or ""),
        )  # fmt: skip
    return out


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str] | None:
    """Slurm's host list (``sc[1-3,05],sn2``) as names, or None for a form not read here
    (several bracket groups in one name): the caller asks ``scontrol show hostnames`` then."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]*)\]([^\[\]]*)", part)
        if m is None:
            if "[" in part or "]" in part:
                return None
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            rm = _RANGE.match(r)
            if rm is None:
                return None
            lo, hi = rm.group(1), rm.group(2) or rm.group(1)
            out += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return out


def parse_scontrol_job(text: str) -> SlurmJobInfo | None:
    """``scontrol show job ID`` (key=value text), or None when Slurm no longer knows the job."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobId" not in fields:
        return None
    code, sig = (fields.get("ExitCode", "") + ":").split(":")[:2]
    return SlurmJobInfo(
        fields["JobId"],
        fields.get("JobName", ""),
        fields.get("JobState", "UNKNOWN").upper(),
        int(code) if code.isdigit() else None,
        int(sig) if sig.isdigit() and int(sig) else None,
        _when(fields.get("StartTime", "")),
        _when(fields.get("EndTime", "")),
        nodes=fields.get("NodeList", ""),
    )


def _when(text: str) -> float | None:
    """Slurm's ``2026-11-30T10:25:15`` (the cluster's local time) as epoch seconds."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None  # "Unknown", "None", empty


#: ``sacct -c`` columns this module asks for, in order.
SACCT_FIELDS = "JobID,JobName,State,ExitCode,Start,End,NodeList"


def parse_sacct(text: str) -> dict[str, SlurmJobInfo]:
    """``sacct -c --parsable2 --noheader --format=SACCT_FIELDS`` rows by job id (the last
    record of an id wins: a job is recorded once per end)."""
    out: dict[str, SlurmJobInfo] = {}
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < 7 or not cols[0]:
            continue
        jid, name, state, exit_code = cols[0], cols[1], cols[2], cols[3]
        code, sig = (exit_code + ":").split(":")[:2]
        word = (state.split() or ["UNKNOWN"])[0].upper()
        out[jid] = SlurmJobInfo(
            jid, name, word,
            int(code) if code.isdigit() else None,
            int(sig) if sig.isdigit() and int(sig) else None,
            _when(cols[4]), _when(cols[5]), nodes=cols[6],
        )  # fmt: skip
    return out
