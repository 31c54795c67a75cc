"""presence.conf: defaults in one place, overrides, and the cache cleared on setting_changed."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from typing import Any

import pytest
from django.test import override_settings

from presence import store as store_module
from presence.conf import SETTING_NAMES, PresenceSettings, get_settings

#: The documented defaults (docs/settings.md), which sites rely on.
DOCUMENTED_DEFAULTS = {
    "CACHE_ALIAS": "default",
    "KEY_PREFIX": "presence",
    "ONLINE_WINDOW": 300,
    "TOUCH_INTERVAL": 30,
    "HEARTBEAT_INTERVAL": 30,
    "CONNECTION_TTL": 90,
    "IDLE_AFTER": 300,
    "OFFLINE_GRACE": 5,
    "MAX_SUBSCRIPTIONS": 1000,
    "RATE_LIMIT": (60, 10),
}


def test_defaults_match_the_contract(settings: Any) -> None:
    del settings.PRESENCE  # (the test settings set none anyway)
    conf = get_settings()
    for key, value in DOCUMENTED_DEFAULTS.items():
        assert getattr(conf, key) == value, key


def test_every_default_is_the_dataclass_default() -> None:
    # One place for defaults: no key is defaulted somewhere else.
    conf = get_settings()
    assert {f.name: getattr(conf, f.name) for f in fields(PresenceSettings)} == {
        f.name: f.default for f in fields(PresenceSettings)
    }
    assert frozenset(DOCUMENTED_DEFAULTS) <= SETTING_NAMES


def test_an_empty_dict_means_the_defaults(settings: Any) -> None:
    settings.PRESENCE = {}
    assert get_settings() == PresenceSettings()


def test_overrides_apply_and_the_rest_keep_defaults(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOW": 2, "KEY_PREFIX": "site1", "SOCKET_TIMEOUT": 0.1}
    conf = get_settings()
    assert (conf.ONLINE_WINDOW, conf.KEY_PREFIX, conf.SOCKET_TIMEOUT) == (2, "site1", 0.1)
    assert conf.TOUCH_INTERVAL == 30
    assert conf.CACHE_ALIAS == "default"


def test_settings_are_cached_until_presence_changes(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOW": 10}
    first = get_settings()
    assert get_settings() is first  # read once

    with override_settings(PRESENCE={"ONLINE_WINDOW": 20}):
        assert get_settings().ONLINE_WINDOW == 20
    # Leaving the override sends setting_changed again.
    assert get_settings().ONLINE_WINDOW == 10

    settings.PRESENCE = {"ONLINE_WINDOW": 30}
    assert get_settings().ONLINE_WINDOW == 30


def test_unrelated_setting_changes_keep_the_cache(settings: Any) -> None:
    first = get_settings()
    settings.TIME_ZONE = "Asia/Tokyo"
    assert get_settings() is first


def test_a_presence_or_caches_change_rebuilds_the_store(settings: Any) -> None:
    store = store_module.get_store()
    settings.PRESENCE = {"KEY_PREFIX": "other"}
    rebuilt = store_module.get_store()
    assert rebuilt is not store
    assert rebuilt.keys.seen_key(7) == "other:{7}:seen"

    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/3"},
    }
    assert store_module.get_store() is not rebuilt
    assert store_module.get_store()._connections.connection_kwargs()[0] == "redis://127.0.0.1:1/3"


def test_a_store_replaced_after_caches_changed_keeps_reaching_its_own_redis(
    settings: Any,
) -> None:
    # A thread still holding the store it took before CACHES changed makes its first client
    # now: it reaches the store's Redis, not the new location (whose outage it would report,
    # as a second outage beside the new store's).
    store = store_module.get_store()
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/3"},
    }
    assert store.client.ping() is True
    assert store._connections.connection_kwargs()[0] != "redis://127.0.0.1:1/3"


def test_rate_limit_list_becomes_a_tuple(settings: Any) -> None:
    # JSON or env-parsed settings give lists; the frozen settings stay hashable.
    settings.PRESENCE = {"RATE_LIMIT": [30, 5]}
    assert get_settings().RATE_LIMIT == (30, 5)
    assert isinstance(get_settings().RATE_LIMIT, tuple)
    hash(get_settings())


def test_unknown_keys_are_ignored(settings: Any) -> None:
    # presence.W001 reports them; they must not break start-up.
    settings.PRESENCE = {"ONLINE_WINDOWS": 1, "online_window": 2, 5: 3, "ONLINE_WINDOW": 60}
    conf = get_settings()
    assert conf.ONLINE_WINDOW == 60
    assert not hasattr(conf, "ONLINE_WINDOWS") and not hasattr(conf, "online_window")


@pytest.mark.parametrize("value", [None, [("ONLINE_WINDOW", 1)], "ONLINE_WINDOW=1"])
def test_a_presence_that_is_not_a_dict_runs_on_defaults(settings: Any, value: Any) -> None:
    # presence.E001 reports it.
    settings.PRESENCE = value
    assert get_settings() == PresenceSettings()


def test_settings_are_read_only() -> None:
    with pytest.raises(FrozenInstanceError):
        get_settings().ONLINE_WINDOW = 1  # type: ignore[misc]


#: The live layer's settings (docs/settings.md).
LIVE_DEFAULTS = {
    "MAX_FRAME_BYTES": 65536,
    "COALESCE_WINDOW": 0.2,
    "SWEEP_INTERVAL": 1.0,
    "SWEEP_BATCH": 500,
}


def test_live_defaults(settings: Any) -> None:
    del settings.PRESENCE
    conf = get_settings()
    assert {key: getattr(conf, key) for key in LIVE_DEFAULTS} == LIVE_DEFAULTS
    assert frozenset(LIVE_DEFAULTS) <= SETTING_NAMES


def test_live_overrides(settings: Any) -> None:
    settings.PRESENCE = {"COALESCE_WINDOW": 0.05, "SWEEP_INTERVAL": 3, "SWEEP_BATCH": 20}
    conf = get_settings()
    assert (conf.COALESCE_WINDOW, conf.SWEEP_INTERVAL, conf.SWEEP_BATCH) == (0.05, 3, 20)
    assert conf.MAX_FRAME_BYTES == 65536
