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
