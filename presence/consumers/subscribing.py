"""One subscribe, a frame's or the opening request's (``?users=...&since=...``, docs/websocket.md):
its users watched, then their snapshot read (only what changed since a stamp, where one proves
something) and sent. In two steps, so that a socket subscribing in its opening request reads what
changed in the round trip of its opening write (:meth:`Subscription.changes_plan`)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from django.utils.translation import gettext

from presence import domain, lifecycle, relations, stamps, users
from presence.conf import get_settings
from presence.consumers import restamping
from presence.consumers.state import Socket
from presence.domain import UserId
from presence.store import Plan

#: "what changed since the stamp" not read yet (answer reads it itself)
UNREAD: Any = object()


def read_user_ids(sent: tuple[int | str, ...]) -> dict[UserId, int | str]:
    """The ids of a subscribe/unsubscribe as the site's pks, each with the value the client sent
    for it (the first, if it named a user twice), or invalid_value naming the first bad one."""
    kind = users.pk_kind()
    ids: dict[UserId, int | str] = {}
    for value in sent:
        try:
            pk = users.parse_user_id(value, kind)
        except ValueError:
            raise domain.InvalidInput(
                "invalid_value",
                gettext("%(value)s is not a user id.") % {"value": repr(value)[:60]},
            ) from None
        ids.setdefault(pk, value)
    return ids


def read_query_ids(sent: tuple[int | str, ...]) -> dict[UserId, int | str]:
    """The ids of the opening request's subscription (strings, a URL's): spelt in the answers as
    a subscribe frame would spell them, numbers on a site of integer pks."""
    ids = read_user_ids(sent)
    if users.pk_kind() == "int":
        return {pk: pk for pk in ids if isinstance(pk, int)}
    return ids


class Subscription:
    """Subscribe ``socket`` to ``ids``: :meth:`watch`, then :meth:`answer`. ``stamped``: the
    client sent ``since`` (a stamp, or None); the snapshot then carries a fresh stamp and lists
    the users left out as ``unchanged`` since ``since`` (docs/websocket.md, "Stamps")."""

    def __init__(
        self, socket: Socket, ids: dict[UserId, int | str], since: str | None, stamped: bool
    ) -> None:
        self.socket = socket
        self.ids = ids
        self.since = since
        self.stamped = stamped
        #: the users not subscribed before, and those of them who exist (watch)
        self.new: list[UserId] = []
        self.existing: set[UserId] = set()
        self.known: list[UserId] = []
        #: what the answer's stamp claims: every change made before this moment is in it
        self.read_at = 0.0

    async def watch(self) -> None:
        """Check the limit, then watch the users who exist (before anything of them is read, so
        that a change during the read is delivered after it: see Hub.deliver)."""
        socket = self.socket
        subscriptions = socket.state.subscriptions
        sent, snapshotting = subscriptions.sent, subscriptions.snapshotting
        self.new = new = [uid for uid in self.ids if uid not in sent and uid not in snapshotting]
        total = len(sent) + len(snapshotting) + len(new)
        limit = socket.state.limits.max_subscriptions
        if total > limit:
            raise domain.InvalidInput(
                "too_many_subscriptions",
                gettext(
                    "This would make %(total)d subscriptions; at most %(limit)d per connection. "
                    "Unsubscribe from some first."
                )
                % {"total": total, "limit": limit},
            )
        # Ids of no user first, at the cost of one query for ids the process has not found
        # before: they join no channel-layer group (a frame of unknown ids would otherwise
        # cost Redis commands for each).
        self.existing = existing = await relations.aexisting(new)
        self.known = known = [uid for uid in new if uid in existing]
        # Its frames name each user as sent.
        subscriptions.spelling.update((uid, self.ids[uid]) for uid in known)
        snapshotting.update(known)
        try:
            await socket.hub.watch(socket, known)
        except BaseException:
            await self.abandon()
            raise
        self.read_at = time.time()

    async def abandon(self) -> None:
        """Nothing of a failed subscribe stays watched."""
        subscriptions = self.socket.state.subscriptions
        subscriptions.snapshotting.difference_update(self.known)
        await asyncio.shield(self.socket.hub.unwatch(self.socket, self.known))
        subscriptions.forget_spellings(self.known)

    def since_time(self) -> float | None:
        """The time the stamp sent proves, None where it proves nothing (or none was sent)."""
        if self.since is None:
            return None
        return stamps.accepted_time(self.since, self.socket.viewer_id)

    def changes_plan(self) -> Plan[dict[UserId, domain.Kind] | None] | None:
        """The read of who changed since the stamp, to ride along another round trip (None:
        nothing to read, the stamp proves nothing or no user is watched)."""
        at = self.since_time()
        if at is None or not self.known:
            return None
        return lifecycle.changes_plan(self.known, self.socket.viewer_id, at)

    async def answer(self, changed: dict[UserId, domain.Kind] | None = UNREAD) -> None:
        """Read the snapshot (``changed``: who changed since the stamp, read already along the
        opening write; None where that read proved nothing) and send it."""
        socket = self.socket
        known = self.known
        subscriptions = socket.state.subscriptions
        try:
            presences, guessed, unchanged = await self._snapshot(changed)
        except BaseException:
            await self.abandon()
            raise
        finally:
            subscriptions.snapshotting.difference_update(known)
        ids = self.ids
        unknown = [uid for uid in self.new if uid not in presences and uid not in unchanged]
        # Users deleted since the existence check (or since the process found them) were
        # watched: leave them again, and check them again next time.
        deleted = [uid for uid in unknown if uid in self.existing]
        relations.forget_existing(deleted)
        await socket.hub.unwatch(socket, deleted)
        subscriptions.forget_spellings(unknown)
        sent = subscriptions.sent
        sent.update(presences)
        # What the client shows of the unchanged is its page's: not known here, so the next
        # change the hub resolves for them is sent whatever it is (visibly_differs(None, ...)).
        sent.update(dict.fromkeys(unchanged))
        if guessed:
            # Redis could not be read: the snapshot shows what the database alone knows
            # (offline). The hub resolves these users again, retrying until Redis answers,
            # and sends a diff where the snapshot was wrong.
            socket.hub.changed(presences)
        extra = None
        if self.stamped:
            extra = {
                "stamp": stamps.mint(socket.viewer_id, self.read_at),
                "unchanged": [ids[uid] for uid in known if uid in unchanged],
            }
        await socket.send_presences("presence_state", presences, extra)
        if self.stamped and subscriptions.restamp_wait == math.inf:
            # The client holds a stamp from now on: it is sent a fresh one when this one is
            # restamp_after old (presence.consumers.restamping).
            subscriptions.restamp_in(self.read_at, restamping.restamp_after(get_settings()))
        if unknown:
            await socket.send_error(
                "unknown_users",
                gettext("No user has the id(s) %(ids)s; the others are subscribed.")
                % {"ids": ", ".join(str(ids[uid]) for uid in unknown)},
                users=[ids[uid] for uid in unknown],
            )

    async def _snapshot(
        self, changed: dict[UserId, domain.Kind] | None
    ) -> tuple[dict[UserId, domain.Presence], bool, set[UserId]]:
        """The snapshot, whether it is a guess (Redis unreadable), and the users left out of it
        as unchanged since the stamp (none where it proves nothing): those who did not change
        since, and those whose changes the viewer may not see (lifecycle.asnapshot_changed)."""
        socket, known = self.socket, self.known
        at = self.since_time()
        if changed is UNREAD:
            changed = None
            if at is not None and known:
                changed = await lifecycle.achanged_since(known, socket.viewer_id, at)
        if changed is not None:
            read = {uid: changed[uid] for uid in known if uid in changed}
            presences, guessed, unseen = (
                await lifecycle.asnapshot_changed(read, socket.user, at)
                if read
                else ({}, False, set())
            )
            return presences, guessed, set(known).difference(read).union(unseen)
        presences, guessed = await lifecycle.asnapshot(known, socket.user)
        return presences, guessed, set()
