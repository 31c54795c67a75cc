"""The store's Lua scripts (presence/store/lua/*.lua, loaded by presence.store.scripts): each
loads with the constants Python uses, and ships with the package."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest
import redis

from presence.store import keys, scripts

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(scripts.ALL))
def test_every_script_loads_into_redis(name: str, redis_client: redis.Redis) -> None:
    script = scripts.ALL[name]
    assert script.source.startswith(scripts.HEADER)
    # Redis compiles it (a syntax error would fail here) and knows it by the sha we send.
    assert redis_client.script_load(script.source) == script.sha


def test_lua_sees_the_constants_of_python(redis_client: redis.Redis) -> None:
    reply = redis_client.eval(
        scripts.HEADER + "return {SCORE_FACTOR, FLAG_IDLE, FLAG_CONNECTED, DEVICE_MASK_LIMIT}", 0
    )
    assert reply == [keys.SCORE_FACTOR, keys.FLAG_IDLE, keys.FLAG_CONNECTED, keys.DEVICE_MASK_LIMIT]


def test_the_scripts_that_only_read_are_told_apart() -> None:
    # A read is sent again after a script Redis lost (presence.store.client): never a write.
    reading = {name for name, script in scripts.ALL.items() if script.reads_only}
    assert reading == {
        "changed_since",
        "describe_connections",
        "read_recent",
        "room_count",
        "room_page",
        "room_read",
    }
    assert scripts.Script("return redis.call('GET', KEYS[1])").reads_only
    assert not scripts.Script("return redis.call('SET', KEYS[1], 1)").reads_only
    # A command not named as a literal may write.
    assert not scripts.Script("local c = 'GET'\nreturn redis.call(c, KEYS[1])").reads_only


def test_the_flags_sit_above_the_device_mask_and_below_the_factor() -> None:
    assert keys.DEVICE_MASK_LIMIT <= keys.FLAG_IDLE < keys.FLAG_CONNECTED < keys.SCORE_FACTOR
    assert keys.FLAG_IDLE + keys.FLAG_CONNECTED + keys.DEVICE_MASK_LIMIT - 1 < keys.SCORE_FACTOR


def test_every_data_file_of_the_package_is_packaged() -> None:
    """Each file under presence/ that is not Python must match a package-data pattern of
    pyproject.toml, or a wheel would leave it out (the Lua scripts, templates, static, locale)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["presence"]
    package = ROOT / "presence"
    missing = []
    for path in package.rglob("*"):
        if path.is_dir() or path.suffix in {".py", ".pyc"} or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(package).as_posix()
        if not any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
            missing.append(relative)
    assert not missing, f"add package-data patterns for: {missing}"


# --- the fragments' tree shaking (scripts.shake) --------------------------------------------------


def _defined(code: str) -> set[str]:
    """The names the top-level local statements of ``code`` define."""
    names: set[str] = set()
    for statement in scripts._statements(code):
        names |= scripts._defines(statement) or set()
    return names


@pytest.mark.parametrize("name", sorted(scripts.ALL))
def test_shaking_keeps_every_fragment_local_a_script_reaches(name: str) -> None:
    """Every name the shaken script uses that a fragment of its defines is still defined: a
    local left out would be read as a missing global at run time, on the path that needs it."""
    fragments = "".join(scripts.read(f) for f in scripts.FRAGMENTS[name])
    kept = scripts.ALL[name].source.removeprefix(scripts.HEADER)
    used = scripts.names_used(kept)
    missing = (used & _defined(fragments)) - _defined(kept)
    assert not missing, missing


def test_a_room_join_leaves_out_the_fragments_it_never_calls() -> None:
    source = scripts.ROOM_JOIN.source
    # the sweep's and the reads' (never called by a join) are out; what a join calls is in,
    # with what those call in turn (room_add -> maybe_split -> bucket -> digest)
    assert "local function record_batch" not in source
    assert "local function room_next_due" not in source
    for kept in ("room_add", "maybe_split", "bucket", "digest", "record", "room_made"):
        assert f"local function {kept}(" in source, kept


def test_shake_keeps_what_is_reached_and_what_must_run() -> None:
    fragment = (
        "-- a comment naming unused()\n"
        "local A, B = 1, 2\n"
        "local function unused() return A end\n"
        "local function helper(x)\n"
        "  return x + B\n"
        "end\n"
        "local function used() return helper(1) end\n"
        "local C = redis.call('GET', 'k')\n"
        "local function writes() return 1 end\n"
        "local D = writes()\n"
        "local named_in_a_string = 3\n"
    )
    shaken = scripts.shake([fragment], "return used() .. 'named_in_a_string' -- unused()\n")
    assert "local function used()" in shaken
    assert "local function helper(x)\n  return x + B\nend\n" in shaken  # reached through used
    assert "local A, B = 1, 2" in shaken  # reached through helper
    assert "local C = redis.call" in shaken  # calls Redis: always runs
    # a value calling a fragment's function always runs (the function may write), with it
    assert "local D = writes()" in shaken
    assert "local function writes()" in shaken
    assert "unused() return A" not in shaken
    assert "named_in_a_string = 3" not in shaken  # a string or a comment is no use


def test_names_used_skip_strings_and_comments() -> None:
    code = "local s = 'a \\' quoted' .. \"b\" --[[ long\ncomment ]] .. [==[ x ]==] -- rest\nf(y)"
    assert scripts.names_used(code) == {"local", "s", "f", "y"}
