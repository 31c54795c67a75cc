"""presence_cleanup's error in a Redis outage reads as one sentence after another (issue 29):
redis-py's reason ends with its own period, which the command no longer doubles."""

from __future__ import annotations

import re
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command

from presence import api
from presence.conf import get_settings
from presence.store import StoreUnavailable

pytestmark = pytest.mark.django_db

STOPPED = (
    "Cleanup stopped; entries leave Redis only after their last seen is saved, so nothing was "
    "lost. Run it again when Redis answers."
)


def test_a_refused_connection_ends_its_sentence_once(
    make_user: Callable[..., Any], private_redis: Any, clock: time_machine.Coordinates
) -> None:
    api.touch(make_user())
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    private_redis.stop()

    with pytest.raises(CommandError) as error:
        call_command("presence_cleanup", stdout=StringIO())

    message = str(error.value)
    assert ".." not in message
    assert re.fullmatch(
        r"Redis is unavailable: Error \d+ connecting to \S+\. Connection refused\. "
        + re.escape(STOPPED),
        message,
    ), message


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("Redis is unavailable: Connection refused.", "Redis is unavailable: Connection refused."),
        ("Redis is too slow: no reply within SOCKET_TIMEOUT (0.5 s)", None),
    ],
)
def test_the_reason_gets_one_period(
    reason: str, said: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(**kwargs: Any) -> Any:
        raise StoreUnavailable(reason)

    monkeypatch.setattr(api, "cleanup", fail)
    with pytest.raises(CommandError) as error:
        call_command("presence_cleanup", stdout=StringIO())
    assert str(error.value) == f"{said or reason + '.'} {STOPPED}"
