"""The Lua scripts, one ``.lua`` file each in ``lua/``, with the score constants injected
from :mod:`presence.store.keys` (so Python and Lua cannot drift) and the shared fragments
(``aggregate.lua``, ``connections.lua``, ``outbox.lua``, ``ledger.lua``, ``room_common.lua``)
prepended where a script uses them: only the top-level locals of the fragments the script
reaches, transitively (:func:`shake`), since Redis runs a script's whole text on every call and
each ``local function`` defined is a closure made again each time (a room's read defined 30,
using 11).

What each script takes (KEYS, ARGV) and returns is described at the top of its file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources

from presence.store.keys import (
    DEVICE_MASK_LIMIT,
    FLAG_CONNECTED,
    FLAG_IDLE,
    ROOM_Z_KEEP,
    SCORE_FACTOR,
)

#: the constants every script sees as Lua locals
CONSTANTS = {
    "SCORE_FACTOR": SCORE_FACTOR,
    "FLAG_IDLE": FLAG_IDLE,
    "FLAG_CONNECTED": FLAG_CONNECTED,
    "DEVICE_MASK_LIMIT": DEVICE_MASK_LIMIT,
    "ROOM_Z_KEEP": ROOM_Z_KEEP,
}
HEADER = "".join(f"local {name} = {value}\n" for name, value in CONSTANTS.items())


#: Redis commands that only read: one run again changes nothing (a plan's command re-sent after
#: a script Redis lost, presence.store.client). PFCOUNT may cache its count in the key: the same
#: count, whenever it runs.
READ_COMMANDS = frozenset(
    {
        "EXISTS", "GET", "HEXISTS", "HGET", "HGETALL", "HKEYS", "HLEN", "HMGET", "HVALS",
        "LINDEX", "LLEN", "LRANGE", "MGET", "PFCOUNT", "PING", "PTTL", "SCARD", "SISMEMBER",
        "SMEMBERS", "SMISMEMBER", "STRLEN", "TIME", "TTL", "TYPE", "ZCARD", "ZCOUNT",
        "ZLEXCOUNT", "ZMSCORE", "ZRANGE", "ZRANGEBYLEX", "ZRANGEBYSCORE", "ZRANK",
        "ZREVRANGE", "ZREVRANGEBYLEX", "ZREVRANGEBYSCORE", "ZREVRANK", "ZSCORE",
    }
)  # fmt: skip

#: a call of Redis from Lua, and one that names its command as a literal
_REDIS_CALL = re.compile(r"redis\.p?call\(")
_NAMED_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


def _reads_only(source: str) -> bool:
    """Whether a script only reads: each of its calls of Redis names a command of
    READ_COMMANDS. Conservative: a command named otherwise than as a literal (or one in a
    comment) counts as a write."""
    named = _NAMED_CALL.findall(source)
    return len(named) == len(_REDIS_CALL.findall(source)) and all(
        name.upper() in READ_COMMANDS for name in named
    )


@dataclass(frozen=True)
class Script:
    source: str
    sha: str = field(init=False)
    #: it only reads (:data:`READ_COMMANDS`): run again, it changes nothing
    reads_only: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())
        object.__setattr__(self, "reads_only", _reads_only(self.source))


def read(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files("presence.store").joinpath("lua", f"{name}.lua").read_text()


#: a Lua long bracket's opening (``[[``, ``[==[``), a quote, a comment or a name
_TOKEN = re.compile(r"--\[(=*)\[|--[^\n]*|\[(=*)\[|'|\"|[A-Za-z_][A-Za-z0-9_]*")
#: a top-level local's names: ``local function f``, ``local a, b = ...``, ``local a``
_DEFINES = re.compile(r"local\s+function\s+(\w+)|local\s+([\w\s,]+?)\s*(?:=|$)")
#: lines at column 0 that continue a statement rather than start one
_CONTINUES = ("end", "else", "elseif", "until", "}", ")", "]")


def names_used(code: str) -> set[str]:
    """The names in Lua ``code``, leaving out its comments and strings."""
    used: set[str] = set()
    at = 0
    while match := _TOKEN.search(code, at):
        token, at = match.group(0), match.end()
        if token.startswith("--") and match.group(1) is None:
            continue  # a line comment
        if token in ("'", '"'):
            # the string's end: the next unescaped same quote
            while at < len(code) and code[at] != token:
                at += 2 if code[at] == "\\" else 1
            at += 1
        elif token[0] in "-[":
            level = match.group(1) if match.group(1) is not None else match.group(2)
            close = code.find("]" + level + "]", at)
            at = len(code) if close < 0 else close + len(level) + 2
        else:
            used.add(token)
    return used


def _statements(fragment: str) -> list[str]:
    """The top-level statements of ``fragment``, each with the comment lines before it: a
    statement starts at a line at column 0 (the fragments' layout: a body is indented, its
    ``end`` at column 0)."""
    statements: list[str] = []
    pending = ""  # comment and blank lines at column 0, for the next statement
    for line in fragment.splitlines(keepends=True):
        if line.startswith("--") or not line.strip():
            pending += line
        elif line[:1].isspace() or line.startswith(_CONTINUES) or not statements:
            if statements:
                statements[-1] += pending + line
            else:
                statements.append(pending + line)
            pending = ""
        else:
            statements.append(pending + line)
            pending = ""
    if pending and statements:
        statements[-1] += pending
    return statements


def _code(statement: str) -> str:
    """The statement without the comment lines before it."""
    lines = statement.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("--")).strip()


def _defines(statement: str) -> set[str] | None:
    """The locals a statement defines; None for one that must always run (not a local
    definition, or a value that calls Redis: defining a function runs none of its body)."""
    code = _code(statement)
    match = _DEFINES.match(code)
    if not match:
        return None
    if match.group(1):
        return {match.group(1)}
    if "redis." in code:
        return None
    return {name.strip() for name in match.group(2).split(",")}


def shake(fragments: list[str], script: str) -> str:
    """The fragments' top-level statements that ``script`` needs: every statement that is not
    a plain local definition (a value that calls one of the fragments' functions is not plain:
    it may write), and the locals the script (or a kept statement) names, transitively; the
    rest is left out, in the fragments' order."""
    statements = [s for fragment in fragments for s in _statements(fragment)]
    defines = [_defines(s) for s in statements]
    functions = {
        name
        for s, names in zip(statements, defines, strict=True)
        if names and _code(s).startswith("local function")
        for name in names
    }
    for i, (s, names) in enumerate(zip(statements, defines, strict=True)):
        code = _code(s)
        if names and not code.startswith("local function") and names_used(code) & functions:
            defines[i] = None
    keep = [d is None for d in defines]
    wanted = names_used(script)
    for s, d in zip(statements, defines, strict=True):
        if d is None:
            wanted |= names_used(s)
    while True:
        grown = False
        for i, (s, d) in enumerate(zip(statements, defines, strict=True)):
            if not keep[i] and d is not None and d & wanted:
                keep[i], grown = True, True
                wanted |= names_used(s)
        if not grown:
            break
    return "".join(s for s, k in zip(statements, keep, strict=True) if k)


#: each script's shared fragments, as :func:`load` was given them
FRAGMENTS: dict[str, tuple[str, ...]] = {}


def load(name: str, *fragments: str) -> Script:
    """``lua/<name>.lua`` after the constants and what it uses of the named shared fragments."""
    FRAGMENTS[name] = fragments
    script = read(name)
    return Script(HEADER + shake([read(fragment) for fragment in fragments], script) + script)


TOUCH = load("touch", "aggregate", "outbox", "ledger", "prior")
SIGN_OFF = load("sign_off", "outbox", "ledger", "prior")
CONNECTION = load("connection", "aggregate", "connections", "outbox", "ledger", "prior")
REMOVE_IF_UNCHANGED = load("remove_if_unchanged", "outbox")
ERASE = load("erase", "outbox", "ledger")
DESCRIBE_CONNECTIONS = load("describe_connections", "aggregate")
CLAIM_DUE = load("claim_due")
RELEASE = load("release")
OUTBOX_CLAIM = load("outbox_claim", "outbox")
SET_INVISIBLE = load("set_invisible", "ledger")
SEED_LEDGER = load("seed_ledger", "ledger")
IS_SEEDED = load("is_seeded", "ledger")
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
    "seed_ledger": SEED_LEDGER,
    "is_seeded": IS_SEEDED,
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
