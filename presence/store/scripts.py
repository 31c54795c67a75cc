"""The Lua scripts, one ``.lua`` file each in ``lua/``, with the score constants injected
from :mod:`presence.store.keys` (so Python and Lua cannot drift) and the shared fragments
(``aggregate.lua``, ``connections.lua``, ``outbox.lua``, ``ledger.lua``, ``room_common.lua``)
prepended where a script uses them.

What each script takes (KEYS, ARGV) and returns is described at the top of its file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import resources

from presence.store.keys import DEVICE_MASK_LIMIT, FLAG_CONNECTED, FLAG_IDLE, SCORE_FACTOR

#: the constants every script sees as Lua locals
CONSTANTS = {
    "SCORE_FACTOR": SCORE_FACTOR,
    "FLAG_IDLE": FLAG_IDLE,
    "FLAG_CONNECTED": FLAG_CONNECTED,
    "DEVICE_MASK_LIMIT": DEVICE_MASK_LIMIT,
}
HEADER = "".join(f"local {name} = {value}\n" for name, value in CONSTANTS.items())


@dataclass(frozen=True)
class Script:
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def read(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files("presence.store").joinpath("lua", f"{name}.lua").read_text()


def load(name: str, *fragments: str) -> Script:
    """``lua/<name>.lua`` after the constants and the named shared fragments."""
    return Script(HEADER + "".join(read(fragment) for fragment in fragments) + read(name))


TOUCH = load("touch", "aggregate", "outbox", "ledger", "prior")
SIGN_OFF = load("sign_off", "outbox", "ledger", "prior")
CONNECTION = load("connection", "aggregate", "connections", "outbox", "ledger", "prior")
REMOVE_IF_UNCHANGED = load("remove_if_unchanged")
ERASE = load("erase", "outbox", "ledger")
DESCRIBE_CONNECTIONS = load("describe_connections", "aggregate")
CLAIM_DUE = load("claim_due")
RELEASE = load("release")
OUTBOX_CLAIM = load("outbox_claim", "outbox")
SET_INVISIBLE = load("set_invisible")
READ_RECENT = load("read_recent")
ROOM_CLAIM = load("room_claim")
ROOM_COUNT = load("room_count")
ROOM_JOIN = load("room_join", "outbox", "room_common")
ROOM_LEAVE = load("room_leave", "outbox", "room_common")
ROOM_PRUNE = load("room_prune", "outbox", "room_common")
ROOM_READ = load("room_read", "outbox", "room_common", "room_reading")
ROOM_PAGE = load("room_page", "outbox", "room_common", "room_reading")
STAMP_CHANGES = load("stamp_changes")
CHANGED_SINCE = load("changed_since")

ALL = {
    "touch": TOUCH,
    "sign_off": SIGN_OFF,
    "connection": CONNECTION,
    "remove_if_unchanged": REMOVE_IF_UNCHANGED,
    "erase": ERASE,
    "describe_connections": DESCRIBE_CONNECTIONS,
    "claim_due": CLAIM_DUE,
    "release": RELEASE,
    "outbox_claim": OUTBOX_CLAIM,
    "set_invisible": SET_INVISIBLE,
    "read_recent": READ_RECENT,
    "room_claim": ROOM_CLAIM,
    "room_count": ROOM_COUNT,
    "room_join": ROOM_JOIN,
    "room_leave": ROOM_LEAVE,
    "room_prune": ROOM_PRUNE,
    "room_read": ROOM_READ,
    "room_page": ROOM_PAGE,
    "stamp_changes": STAMP_CHANGES,
    "changed_since": CHANGED_SINCE,
}
