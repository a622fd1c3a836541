"""Project memberships set by admins (stored; the config's ``projects.NAME.members`` add to
them). Every change is audited."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from mlops_gpu.server.auth import Identity, identity, require_admin
from mlops_gpu.server.errors import ApiError
from mlops_gpu.server.schemas import MemberBody

router = APIRouter(tags=["members"])
Who = Annotated[Identity, Depends(identity)]
UserName = Annotated[str, Path(min_length=1, max_length=200)]


def _set(request: Request, who: Identity, project: str, user: str, role: str | None) -> None:
    from mlops_gpu.state.users import UserError, set_membership

    request.state.audit_target = f"{project}/{user}"
    request.state.audit_detail = f"role {role}" if role else "role removed"
    require_admin(who)
    if project not in request.app.state.rt.cfg.projects:
        raise ApiError(404, "not_found", f"no project {project!r}", "project")
    try:
        set_membership(request.app.state.rt.store, user, project, role)
    except UserError as e:
        raise ApiError(404, "not_found", str(e), "user") from None
    # committed: the new role counts from the next request on, in every worker
    request.app.state.identities.invalidate()


@router.put("/projects/{project}/members/{user}", summary="Give a user a role in a project")
def put_member(
    project: str, user: UserName, body: MemberBody, request: Request, who: Who
) -> dict[str, Any]:
    _set(request, who, project, user, body.role)
    return {"project": project, "user": user, "role": body.role}


@router.delete("/projects/{project}/members/{user}", summary="Remove a user's stored role")
def delete_member(project: str, user: UserName, request: Request, who: Who) -> dict[str, Any]:
    _set(request, who, project, user, None)
    return {"project": project, "user": user, "role": None}
