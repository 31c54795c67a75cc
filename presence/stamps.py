"""Stamps: "what I show was resolved for me at time T" (docs/websocket.md, "Stamps").

A page's dots carry the stamp of the request that rendered them, and each snapshot a client
asked a stamp for carries a fresh one (and a connection open past half of RESUME_WINDOW is sent
one once its deliveries are proved caught up: presence.consumers.restamping). A subscribe that
hands one back is sent only the users who may look different now than at T
(presence.lifecycle.asnapshot_since): most page views, nobody.

A stamp is ``<milliseconds>.<signature>``: the time, signed (the site's SECRET_KEY) together
with the viewer it was resolved for and the settings that shape what a viewer sees. A stamp of
another viewer, of other settings, forged, garbled, from the future (past STAMP_SLACK), older
than RESUME_WINDOW or of another UTC day than now (the approximate last seen moves at midnight)
proves nothing: its subscribe gets the full snapshot.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Collection
from typing import Any

from django.utils.crypto import salted_hmac

from presence.conf import STAMP_SLACK, PresenceSettings, get_settings
from presence.domain import DAY, Kind
from presence.store import Plan, get_store
from presence.users import UserId, encode_id, viewer_pk

_SALT = "presence.stamps"
#: characters of the signature kept (80 bits)
_SIGNATURE_LENGTH = 20


#: the last settings fingerprinted, and their fingerprint (settings are read once and cached:
#: the same object until PRESENCE changes)
_fingerprinted: tuple[PresenceSettings | None, str] = (None, "")


def _fingerprint(conf: PresenceSettings) -> str:
    """The settings that shape what a viewer is shown: a stamp made under others (a deploy
    in between) proves nothing."""
    global _fingerprinted
    if _fingerprinted[0] is conf:
        return _fingerprinted[1]
    shaping = {
        "prefix": conf.KEY_PREFIX,
        "privacy": sorted(conf.DEFAULT_PRIVACY.items()) if conf.DEFAULT_PRIVACY else None,
        "approximate": conf.APPROXIMATE_LAST_SEEN,
        "reciprocal": conf.RECIPROCAL_LAST_SEEN,
        "window": conf.ONLINE_WINDOW,
        "grace": conf.OFFLINE_GRACE,
        "ttl": conf.CONNECTION_TTL,
    }
    fingerprint = json.dumps(shaping, sort_keys=True, default=repr)
    _fingerprinted = (conf, fingerprint)
    return fingerprint


def _signature(viewer_id: UserId, millis: int) -> str:
    message = f"{encode_id(viewer_id)}|{millis}|{_fingerprint(get_settings())}"
    return salted_hmac(_SALT, message, algorithm="sha256").hexdigest()[:_SIGNATURE_LENGTH]


def mint(viewer_id: UserId, at: float) -> str:
    """The stamp of presences resolved for ``viewer_id`` at ``at`` (epoch seconds, rounded
    down to the millisecond: a stamp never claims more than was read)."""
    millis = int(at * 1000)
    return f"{millis}.{_signature(viewer_id, millis)}"


def accepted_time(stamp: str, viewer_id: UserId, now: float | None = None) -> float | None:
    """The time ``stamp`` proves ``viewer_id`` was shown, or None where it proves nothing
    (see the module's docstring); never raises."""
    if not isinstance(stamp, str):
        return None
    digits, _, signature = stamp.partition(".")
    if not digits.isascii() or not digits.isdigit() or len(digits) > 16:
        return None
    if not signature.isascii():
        return None  # (a lone surrogate would not even encode)
    millis = int(digits)
    if not hmac.compare_digest(signature.encode(), _signature(viewer_id, millis).encode()):
        return None
    at = millis / 1000
    now = time.time() if now is None else now
    if at > now + STAMP_SLACK or now - at > get_settings().RESUME_WINDOW:
        return None
    if (at - STAMP_SLACK) // DAY != (now + STAMP_SLACK) // DAY:
        return None  # the approximate last seen may have moved at midnight
    return at


#: the request's attributes: when its presences began to be resolved, the store's count of
#: guesses then (PresenceStore.guesses), and its stamp
_SINCE_ATTR = "_presence_since"
_GUESSES_ATTR = "_presence_guesses"
_STAMP_ATTR = "_presence_stamp"


def note_read(request: Any) -> None:
    """A read of presence for ``request`` starts now: the page's stamp is no later than its
    first one (the middleware notes it before the view, whose transaction may see the database
    as it was when it began)."""
    if request is not None and getattr(request, _SINCE_ATTR, None) is None:
        setattr(request, _GUESSES_ATTR, get_store().guesses)
        setattr(request, _SINCE_ATTR, time.time())


def page_stamp(request: Any) -> str | None:
    """The stamp of the presences this request's tags rendered (``data-presence-since``): the
    viewer's, as of the request's first read. None for an anonymous viewer or no request,
    and from the moment a read answered with its fallback (Redis unavailable or too slow for
    the page): what the page shows then is the database's guess (offline), which a change
    stamp would never correct. (The store's count is the process's: a guess in another
    thread meanwhile costs this page a full snapshot, never a wrong dot.)"""
    if request is None or get_store().known_down():
        return None
    if getattr(request, _GUESSES_ATTR, None) != get_store().guesses:
        return None
    stamp = getattr(request, _STAMP_ATTR, None)
    if stamp is None:
        since = getattr(request, _SINCE_ATTR, None)
        viewer = viewer_pk(getattr(request, "user", None))
        if since is None or viewer is None:
            return None
        stamp = mint(viewer, since)
        setattr(request, _STAMP_ATTR, stamp)
    return str(stamp)


def changed_since_plan(
    user_ids: Collection[UserId], viewer_id: UserId, since: float, high: float
) -> Plan[dict[UserId, Kind] | None]:
    """The users among ``user_ids`` who may look different now than at ``since`` (a stamp's
    time), as the change stamps prove it: each with the kinds of its changes since ``since``
    less STAMP_SLACK (the clocks' slack), a schedule due up to ``high`` counting as one (a turn
    offline, a custom status's end). None where Redis cannot prove it: unavailable, flushed,
    or its stamps not kept that far back. No commands for no users."""
    if not user_ids:
        return Plan(commands=[], parse=lambda replies: {}, fallback={})
    low = since - STAMP_SLACK
    read = get_store().plans.changed_since(user_ids, viewer_id, low, high)

    def parse(replies: list[Any]) -> dict[UserId, Kind] | None:
        found = read.parse(replies)
        if found is None or found[0] > low:
            return None
        return found[1]

    return Plan(commands=read.commands, parse=parse, fallback=None)
