"""The hub's registry: the connections open in this process and what each one is a member of.

All per-connection state of the hub lives here, one :class:`Membership` per kind: the users a
connection watches, the account it was opened for, its topics, its rooms (with what it was
sent of each and the rooms it was let into: :class:`RoomMemberships`). The process is in the
channel-layer group of a key while the key has members here (presence.hub.groups does the
joining and leaving).

A new kind of membership (rooms, say: room -> connections) is one more :class:`Membership`
with its group name here, named in :meth:`Registry.other_groups`; the hub then joins and leaves
its groups as its first member comes and its last one goes, and renews, keeps and leaves them
with the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from presence.announce import (
    account_group_name,
    group_name,
    room_group_name,
    rooms_group_name,
    topic_group_name,
)
from presence.domain import Presence, UserId
from presence.domain.rooms import Member, RoomState
from presence.rooms.live import ConnectionRooms
from presence.sessions import Credential


class Connection(Protocol):
    """What the hub needs of a consumer."""

    viewer_id: UserId
    #: the user the connection was opened for
    user: Any
    #: the presence last sent for each subscribed user (None: what the client's page showed,
    #: not known here; presence.stamps)
    sent: dict[UserId, Presence | None]
    #: users whose snapshot is being read; a change meanwhile is delivered again after it
    snapshotting: set[UserId]

    async def send_presences(
        self,
        kind: str,
        presences: dict[UserId, Presence],
        extra: dict[str, Any] | None = None,
    ) -> None: ...

    async def send_json(self, content: dict[str, Any]) -> None: ...

    #: what the connection authenticated with (presence.sessions), None when it is never
    #: re-checked (another authentication middleware)
    credential: Credential | None

    async def end_session(self) -> None:
        """Close the connection: its session ended."""

    async def recheck_session(self) -> None:
        """Close the connection if its session or token is no longer valid."""

    async def end_account(self) -> None:
        """Close the connection: its user was deleted (out of its rooms at once)."""


Key = TypeVar("Key", bound=Hashable)


class Membership(Generic[Key]):
    """One kind of membership, both ways round: the connections of each key, and the keys of
    each connection (a close must not scan every key: tens of thousands of watched users in a
    busy process). Neither side keeps an empty set."""

    def __init__(self, group: Callable[[Key], str]) -> None:
        #: the channel-layer group of a key
        self.group = group
        self.members: dict[Key, set[Connection]] = {}
        self.of: dict[Connection, set[Key]] = {}

    def add(self, connection: Connection, key: Key) -> bool:
        """Make ``connection`` a member of ``key``: True when it is the key's first here."""
        members = self.members.setdefault(key, set())
        first = not members
        members.add(connection)
        self.of.setdefault(connection, set()).add(key)
        return first

    def discard(self, connection: Connection, key: Key) -> bool:
        """``connection`` is no longer a member of ``key``: True when it was the last here."""
        members = self.members.get(key)
        if members is None or connection not in members:
            return False
        members.discard(connection)
        keys = self.of.get(connection)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.of[connection]
        if members:
            return False
        del self.members[key]
        return True

    def add_all(self, connection: Connection, keys: Iterable[Key]) -> list[Key]:
        """:meth:`add` for each of ``keys``: the keys it is the first member of here."""
        first: list[Key] = []
        members = self.members
        own = self.of.setdefault(connection, set())
        for key in keys:
            connections = members.get(key)
            if connections is None:
                members[key] = {connection}
                first.append(key)
            else:
                connections.add(connection)
            own.add(key)
        if not own:
            del self.of[connection]
        return first

    def discard_all(self, connection: Connection) -> list[Key]:
        """``connection`` is a member of nothing any more (it closed): the keys it was the last
        member of here. One pass, not a :meth:`discard` per key (a page view's 50 users)."""
        last: list[Key] = []
        members = self.members
        for key in self.of.pop(connection, ()):
            connections = members.get(key)
            if connections is None:
                continue
            connections.discard(connection)
            if not connections:
                del members[key]
                last.append(key)
        return last

    def keys_of(self, connection: Connection) -> list[Key]:
        """The keys ``connection`` is a member of (a copy)."""
        return list(self.of.get(connection, ()))

    def groups(self) -> list[str]:
        """The groups of every key with members here (a copy)."""
        return [self.group(key) for key in self.members]


@dataclass
class View:
    """What a connection was last sent of a room (presence.hub.rooms)."""

    listed: dict[UserId, Member] = field(default_factory=dict)
    #: each listed member's place in the listing order but the viewer's (reading.rank)
    ranks: dict[UserId, tuple[bool, float, str]] = field(default_factory=dict)
    others: int = 0
    #: a room_state is being read (changes meanwhile are delivered again after it)
    reading: bool = True
    #: bumped at each room_state: a delta read before it must not be applied to it
    generation: int = 0
    #: how far the room_state's read by join time went (RoomState.read_to): a cursor made
    #: from this view starts no further
    read_to: float = math.inf

    def show(self, state: RoomState, viewer_id: UserId) -> None:
        """The room_state just read for its connection: what it is sent from now on."""
        self.listed = dict(state.members)
        # every listed member's place but the viewer's, who is never taken out
        self.ranks = {uid: r for uid, r in state.ranks.items() if uid != viewer_id}
        self.others = state.others
        self.read_to = state.read_to
        self.reading = False


class RoomMemberships(Membership[str]):
    """Rooms: the connections in each room (its group joined for them, their views), and of
    each connection its view of each room and the rooms it was let into (its
    :class:`~presence.rooms.live.ConnectionRooms`: their metas, invisible flag and lock)."""

    def __init__(self) -> None:
        super().__init__(room_group_name)
        #: connection -> room -> what it was last sent of the room
        self.views: dict[Connection, dict[str, View]] = {}
        #: connection -> the rooms it joined, for each connection that joined one
        self.joined: dict[Connection, ConnectionRooms] = {}

    def joined_by(self, connection: Connection) -> ConnectionRooms | None:
        """The rooms ``connection`` joined, if it ever joined one."""
        return self.joined.get(connection)

    def release(self, connection: Connection) -> ConnectionRooms | None:
        """``connection`` closed: the rooms it joined, no longer the registry's."""
        return self.joined.pop(connection, None)


class Topics:
    """Topics of connections (presence.extensions): kind -> connection -> keys. One group per
    kind, not per key: the deliveries of a kind pick the connections of each key."""

    def __init__(self) -> None:
        self.members: dict[str, dict[Connection, set[str]]] = {}

    @staticmethod
    def group(kind: str) -> str:
        return topic_group_name(kind)

    def add(self, connection: Connection, kind: str, key: str) -> bool:
        """Give ``connection`` the key: True when it is the kind's first connection here."""
        members = self.members.setdefault(kind, {})
        first = not members
        members.setdefault(connection, set()).add(key)
        return first

    def discard(self, connection: Connection, kind: str, key: str) -> bool:
        """Take the key from ``connection``: True when it was the kind's last connection."""
        members = self.members.get(kind)
        keys = None if members is None else members.get(connection)
        if members is None or keys is None or key not in keys:
            return False
        keys.discard(key)
        if keys:
            return False
        del members[connection]
        if members:
            return False
        del self.members[kind]
        return True

    def kinds_of(self, connection: Connection) -> list[str]:
        return [kind for kind, members in self.members.items() if connection in members]

    def keys_of(self, connection: Connection, kind: str) -> set[str]:
        """The keys of ``kind`` that ``connection`` has (a copy)."""
        return set(self.members.get(kind, {}).get(connection, ()))

    def members_of(self, kind: str) -> dict[Connection, set[str]]:
        """Every connection with keys of ``kind``, and its keys (copies)."""
        return {c: set(keys) for c, keys in self.members.get(kind, {}).items()}

    def groups(self) -> list[str]:
        return [self.group(kind) for kind in self.members]


class Registry:
    """The connections open here and their memberships."""

    def __init__(self) -> None:
        self.connections: set[Connection] = set()
        #: user -> the connections subscribed to them (``watched``: the other way round)
        self.watchers = Membership[UserId](group_name)
        #: user -> their connections opened with a session or a token (see account_group_name)
        self.accounts = Membership[UserId](account_group_name)
        self.topics = Topics()
        #: room name -> the connections in it, and each connection's rooms
        self.rooms = RoomMemberships()
        #: room name -> the connections watching its count (watch_room_count), not in it: the
        #: room's group is joined for them as for its members (presence.hub.room_counts)
        self.room_counts = Membership[str](room_group_name)

    def other_groups(self) -> Iterator[str]:
        """The groups of every kind of membership but the watchers' (theirs are joined and left
        in batches). Each kind's groups are listed when the caller reaches it: a caller that
        awaits between groups sees a later kind as it is by then."""
        for membership in (self.accounts, self.topics, self.rooms):
            yield from membership.groups()
        # A room both joined and watched here is one group.
        yield from (
            self.room_counts.group(room)
            for room in self.room_counts.members
            if room not in self.rooms.members
        )
        if self.rooms.members or self.room_counts.members:
            yield rooms_group_name()

    def needs_room(self, room: str) -> bool:
        """Whether a connection here is in ``room`` or watches its count (its group is kept)."""
        return room in self.rooms.members or room in self.room_counts.members

    def needs_rooms(self) -> bool:
        """Whether a connection here is in a room or watches a room's count (the group of
        every process with room views is kept: privacy changes reach it)."""
        return bool(self.rooms.members or self.room_counts.members)

    def wanted_groups(self) -> set[str]:
        """Every group this process should be in now."""
        return {*self.watchers.groups(), *self.other_groups()}
