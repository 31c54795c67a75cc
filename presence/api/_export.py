"""A user's data (``export_user_data``, ``manage.py presence_export``): everything presence
holds about one user, JSON-ready, for data requests (GDPR's access and portability).

What is theirs: their own rows (privacy settings, always/never share with, contacts they added,
users they blocked, their last seen, their custom status), who added them as a contact (a
relation they are a party to), and what Redis holds about them (live state, connections,
schedules, rooms). Not theirs to see: other users' privacy choices about them (who blocked
them, who marked them a close friend, other users' exceptions naming them); those stay out.
Docs: docs/privacy.md, "Your users' data".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from presence import resolution
from presence.api._reading import aget_presence, get_presence
from presence.conf import get_settings
from presence.domain import Device, devices_from_mask, iso_time
from presence.models import (
    Block,
    Contact,
    LastSeen,
    PrivacyException,
    PrivacySettings,
    UserStatus,
    privacy_defaults,
)
from presence.operations import Operation, arun, call, redis, run
from presence.rooms.cards import display_name
from presence.store import RAISE, PresenceStore, UserRecord, get_store, merge
from presence.users import UserId, user_pk

#: rooms read per round trip while looking for the user's
ROOMS_PER_ROUND_TRIP = 200


def _id(pk: UserId) -> int | str:
    """A pk in JSON: an integer as itself, a UUID or a string as text."""
    return pk if isinstance(pk, int) else str(pk)


def _at(seconds: float | None) -> str | None:
    return None if seconds is None else iso_time(datetime.fromtimestamp(seconds, UTC))


def _other(user: Any) -> dict[str, Any]:
    return {"user": _id(user.pk), "name": display_name(user)}


def _database(uid: Any) -> dict[str, Any]:
    """The user's rows, as JSON (one query per table)."""
    row = PrivacySettings.objects.filter(user_id=uid).first()
    defaults = privacy_defaults()
    if row is not None:
        levels = (row.online_visibility, row.last_seen_visibility, row.activity_visibility)
    else:
        levels = (
            defaults.online_visibility.value,
            defaults.last_seen_visibility.value,
            defaults.activity_visibility.value,
        )
    status = UserStatus.objects.filter(user_id=uid).first()
    seen, prior = LastSeen.objects.filter(user_id=uid).values_list(
        "seen_at", "prior_seen_at"
    ).first() or (None, None)
    return {
        "privacy": {
            "online_visibility": str(levels[0]),
            "last_seen_visibility": str(levels[1]),
            "activity_visibility": str(levels[2]),
            "invisible": bool(row and row.invisible),
            # False: never chosen; these are the site's defaults (DEFAULT_PRIVACY)
            "saved": row is not None,
        },
        "exceptions": [
            {**_other(e.viewer), "setting": e.setting, "allow": e.allow}
            for e in PrivacyException.objects.filter(owner_id=uid)
            .select_related("viewer")
            .order_by("viewer_id", "setting")
        ],
        "contacts": {
            "added": [
                {**_other(c.contact), "close_friend": c.close_friend, "at": iso_time(c.created_at)}
                for c in Contact.objects.filter(owner_id=uid)
                .select_related("contact")
                .order_by("contact_id")
            ],
            "added_by": [
                {**_other(c.owner), "at": iso_time(c.created_at)}
                for c in Contact.objects.filter(contact_id=uid)
                .select_related("owner")
                .order_by("owner_id")
            ],
        },
        "blocks": [
            {**_other(b.blocked), "at": iso_time(b.created_at)}
            for b in Block.objects.filter(blocker_id=uid)
            .select_related("blocked")
            .order_by("blocked_id")
        ],
        "saved_last_seen": iso_time(seen),
        "saved_before_today": iso_time(prior),
        "saved_status": None
        if status is None
        else {
            "dnd": status.dnd,
            "text": status.text or None,
            "emoji": status.emoji or None,
            "activity": status.activity or None,
            "expires_at": iso_time(status.expires_at),
            "updated_at": iso_time(status.updated_at),
        },
    }


def _connections(entries: tuple[str, ...]) -> tuple[list[Any], list[Any]]:
    """The connections (device, idle, since, last heartbeat) and the page views made while
    connected (device, at), from lua/describe_connections.lua's entries; ids left out."""
    connections, pages = [], []
    for entry in entries:
        name, bit, idle, since, beat = entry.split(":")[-5:]
        device = _device(int(bit))
        if name.startswith("h"):
            pages.append({"device": device, "at": _at(float(since))})
        else:
            connections.append(
                {
                    "device": device,
                    "idle": idle == "1",
                    "connected_at": _at(float(since)),
                    "last_heartbeat": _at(float(beat)),
                }
            )
    return connections, pages


def _device(bit: int) -> str:
    devices = devices_from_mask(bit)
    return devices[0].value if devices else Device.WEB.value


def _redis(record: UserRecord) -> dict[str, Any]:
    live = record.live
    connections, pages = _connections(record.connections)
    in_ledger = "online" if record.online_until else "hidden" if record.hidden_until else None
    return {
        "live": None
        if live is None
        else {
            "last_active": _at(live.last_active),
            "devices": [d.value for d in live.devices],
            "connected": live.connected,
            "idle": live.idle,
            "signed_off": live.signed_off,
        },
        "last_seen_before_today": _at(record.prior),
        "connections": connections,
        "page_views_while_connected": pages,
        "offline_due_at": _at(record.due),
        # the online count's ledger: counted ("online") or invisible ("hidden"), until when
        "online_ledger": in_ledger
        and {
            "as": in_ledger,
            "until": _at(record.online_until or record.hidden_until),
        },
        "invisible": record.invisible,
        "status_expires_at": _at(record.status_expires),
    }


def _rooms(uid: UserId, now: float) -> Operation[list[dict[str, Any]]]:
    """The rooms the user is in now, with when they joined and the meta they show: every room
    with members is read for this one user (O(rooms on the site), in round trips of
    ROOMS_PER_ROUND_TRIP)."""
    if not get_settings().ROOMS:
        return []
    store = get_store()
    names = yield from redis(store.plans.scheduled_rooms())
    found: list[dict[str, Any]] = []
    for start in range(0, len(names), ROOMS_PER_ROUND_TRIP):
        chunk = names[start : start + ROOMS_PER_ROUND_TRIP]
        reads = yield from redis(merge([_strict(store, room, now, uid) for room in chunk]))
        for room, read in zip(chunk, reads, strict=True):
            if read is not None and uid in read.found:
                entry = read.members[uid]
                found.append(
                    {
                        "room": room,
                        "joined_at": _at(entry.joined_at / 1000),
                        "meta": entry.meta and json.loads(entry.meta),
                        "invisible": entry.invisible,
                    }
                )
    return found


def _strict(store: PresenceStore, room: str, now: float, uid: UserId) -> Any:
    plan = store.plans.read_room(room, now, 0, [uid])
    plan.fallback = RAISE  # an export must not leave a room out for an outage
    return plan


def _export(user: Any) -> Operation[dict[str, Any]]:
    uid = user_pk(user)
    now = resolution.now()
    store = get_store()
    record = yield from redis(store.plans.describe_user(uid))
    rooms = yield from _rooms(uid, now)
    database = yield from call(_database, uid)
    own = yield from call(get_presence, user, user, afunction=aget_presence)
    saved = database.pop("saved_status")
    return {
        "user": _id(uid),
        "privacy": database["privacy"],
        "exceptions": database["exceptions"],
        "contacts": database["contacts"],
        "blocks": database["blocks"],
        "last_seen": {
            "latest": iso_time(own.last_seen),
            "saved": database["saved_last_seen"],
            "saved_before_today": database["saved_before_today"],
        },
        "status": {
            "status": own.status.value,
            "invisible": database["privacy"]["invisible"],
            "dnd": bool(saved and saved["dnd"]),
            "text": saved and saved["text"],
            "emoji": saved and saved["emoji"],
            "activity": saved and saved["activity"],
            "expires_at": saved and saved["expires_at"],
            "updated_at": saved and saved["updated_at"],
        },
        "rooms": rooms,
        "redis": _redis(record),
    }


def export_user_data(user: Any) -> dict[str, Any]:
    """Everything presence holds about ``user`` (a user or a user id), JSON-ready: ``user``,
    ``privacy``, ``exceptions``, ``contacts`` (``added`` and ``added_by``), ``blocks``,
    ``last_seen``, ``status``, ``rooms`` and ``redis``. Raises StoreUnavailable when Redis
    cannot be read (an export without it would be incomplete). For data requests; not for
    request paths (it reads every room with members when ROOMS is set)."""
    return run(_export(user))


async def aexport_user_data(user: Any) -> dict[str, Any]:
    return await arun(_export(user))
