"""JSON endpoints. Errors are JSON too: 400 for bad input, 401 for anonymous callers."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_GET, require_POST

from presence import api
from presence.domain import InvalidInput

MAX_IDS = 500
MAX_BODY_BYTES = 4096


def error(code: str, message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _unauthenticated() -> JsonResponse:
    return error("not_authenticated", _("Log in to see presence."), status=401)


def parse_user_ids(raw: str | None) -> list[int]:
    if raw is None or not raw.strip():
        raise InvalidInput("missing_users", "Pass user ids as ?users=1,2,3.")
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if len(parts) > MAX_IDS:
        raise InvalidInput(
            "too_many_users", f"At most {MAX_IDS} ids per request; got {len(parts)}."
        )
    ids: list[int] = []
    for part in parts:
        if not part.isdigit() or len(part) > 18:
            raise InvalidInput("invalid_users", f"{part[:40]!r} is not a user id.")
        ids.append(int(part))
    return ids


@require_GET
def presence_view(request: HttpRequest) -> JsonResponse:
    if not request.user.is_authenticated:
        return _unauthenticated()
    try:
        ids = parse_user_ids(request.GET.get("users"))
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    presences = api.bulk_presence(ids, request.user)
    return JsonResponse(
        {"presences": {str(pk): presence.as_dict() for pk, presence in presences.items()}}
    )


@csrf_protect
@require_POST
def status_view(request: HttpRequest) -> JsonResponse:
    if not request.user.is_authenticated:
        return _unauthenticated()
    if len(request.body) > MAX_BODY_BYTES:
        return error("payload_too_large", f"The body must be at most {MAX_BODY_BYTES} bytes.")
    try:
        data: Any = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return error("invalid_json", "The body is not valid JSON.")
    try:
        change = api.domain.parse_status_change(data, api.limits())
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    presence = api.apply_change(request.user, change)
    return JsonResponse({"presence": presence.as_dict()})
