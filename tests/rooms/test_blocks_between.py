"""relations.blocks_between: each viewer's counterparts in a block either way (a room's count
leaves them out), in one query of its own SQL; the same answer for integer and UUID keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from presence import relations
from presence.models import Block

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


def test_each_viewer_gets_its_counterparts_either_way_and_no_one_elses(
    make_user: Callable[..., Any],
) -> None:
    a, b, c, d, e = (make_user() for _ in range(5))
    Block.objects.create(blocker=a, blocked=b)  # both viewers: each sees the other
    Block.objects.create(blocker=c, blocked=a)  # a is blocked by one who is not a viewer
    Block.objects.create(blocker=d, blocked=e)  # neither is a viewer
    found = relations.blocks_between([a.pk, b.pk, e.pk])
    assert found == {a.pk: {b.pk, c.pk}, b.pk: {a.pk}, e.pk: {d.pk}}
    assert relations.blocks_between([]) == {}
    assert relations.blocks_between([c.pk, c.pk]) == {c.pk: {a.pk}}
