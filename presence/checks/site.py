"""System checks of the site around presence: its middleware, user model, time zone and
templates (presence.E006-E008, E014, W004). Ids are stable; each has a hint."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from presence import users

MIDDLEWARE_PATH = "presence.middleware.PresenceMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"


@register(Tags.compatibility)
def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", []) or [])
    if MIDDLEWARE_PATH not in middleware:
        return [
            Error(
                f"{MIDDLEWARE_PATH} is not in MIDDLEWARE, so page views are not recorded.",
                hint=f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE after {AUTH_MIDDLEWARE_PATH!r}.",
                id="presence.E006",
            )
        ]
    if AUTH_MIDDLEWARE_PATH not in middleware or middleware.index(
        AUTH_MIDDLEWARE_PATH
    ) > middleware.index(MIDDLEWARE_PATH):
        return [
            Error(
                f"{MIDDLEWARE_PATH} must come after {AUTH_MIDDLEWARE_PATH} in MIDDLEWARE.",
                hint="It needs request.user; move it below AuthenticationMiddleware.",
                id="presence.E007",
            )
        ]
    return []


@register(Tags.models)
def check_user_model(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.E008: a user model whose primary key presence cannot key by. Integer, UUID and
    string (CharField, TextField) keys work; a composite key (or a date, bytes, ...) does not."""
    pk = users.pk_field()
    if users.kind_of(pk) is not None:
        return []
    return [
        Error(
            f"The user model's primary key is a {type(pk).__name__}; presence needs an "
            "integer, UUID or string primary key.",
            hint="Presence names users in Redis, URLs and WebSocket frames by one primary key "
            "value: use an AutoField/BigAutoField, a UUIDField or a CharField as the pk.",
            id="presence.E008",
        )
    ]


@register(Tags.compatibility)
def check_time_zone_support(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.E014: ``USE_TZ = False``. Presence's times are UTC instants (Redis, the last
    seen it saves, "5 minutes ago"); the database refuses such times without time zone
    support, and naive local times cannot be compared with them."""
    if getattr(settings, "USE_TZ", True):
        return []
    return [
        Error(
            "USE_TZ is False; presence stores and compares times as UTC instants.",
            hint="Set USE_TZ = True (Django's default since 5.0); TIME_ZONE still sets the "
            "time zone pages show times in.",
            id="presence.E014",
        )
    ]


REQUEST_CONTEXT_PROCESSOR = "django.template.context_processors.request"


@register(Tags.templates)
def check_request_context_processor(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.W004: presence's template tags read the viewer from the context's request; without
    the context processor only pages rendered with their request (a RequestContext) have one."""
    engines = [
        engine
        for engine in getattr(settings, "TEMPLATES", [])
        if engine.get("BACKEND") == "django.template.backends.django.DjangoTemplates"
    ]
    if not engines or any(
        REQUEST_CONTEXT_PROCESSOR in engine.get("OPTIONS", {}).get("context_processors", [])
        for engine in engines
    ):
        return []
    return [
        Warning(
            "No DjangoTemplates engine has the 'request' context processor: presence's "
            "template tags then rely on each page being rendered with its request "
            "(render(request, ...)); one rendered without it shows every user as a stranger "
            "sees them (quietly offline).",
            hint=f"Add {REQUEST_CONTEXT_PROCESSOR!r} to TEMPLATES[...]['OPTIONS']"
            "['context_processors'].",
            id="presence.W004",
        )
    ]
