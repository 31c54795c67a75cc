"""presence.api's privacy choices from code: ``set_privacy`` (the levels), ``set_invisible``
(invisible, the status kept) and ``online_among`` (who of some users is online, as a viewer may
see it), with their async twins: saved through the model as the settings page saves them, so
open sockets and Redis's copy of invisible follow."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext

from presence import api
from presence.domain import InvalidInput, Status, Visibility
from presence.models import Block, Contact, PrivacySettings, UserStatus
from presence.signals import presence_changed
from presence.store import get_store
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import count_round_trips

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]

UNKNOWN_ID = 987_654_321


@pytest.fixture
def saved_fields() -> Iterator[list[frozenset[str] | None]]:
    """The ``update_fields`` of each PrivacySettings save (None: every field, a new row)."""
    saves: list[frozenset[str] | None] = []

    def record(sender: Any, update_fields: frozenset[str] | None, **kwargs: Any) -> None:
        saves.append(None if update_fields is None else frozenset(update_fields))

    post_save.connect(record, sender=PrivacySettings, dispatch_uid="test.saved_fields")
    yield saves
    post_save.disconnect(sender=PrivacySettings, dispatch_uid="test.saved_fields")


def _levels(user: Any) -> tuple[str, str, str]:
    row = PrivacySettings.objects.get(user=user)
    return (row.online_visibility, row.last_seen_visibility, row.activity_visibility)


# --- set_privacy -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_set_privacy_makes_a_row_only_for_a_level_that_differs_from_the_default(
    make_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": {"last_seen_visibility": "everyone"}}
    user = make_user()
    # The site's defaults already: nothing to save, and the user keeps following them.
    assert api.set_privacy(user, online_visibility="contacts") is False
    assert api.set_privacy(user, last_seen_visibility=Visibility.EVERYONE) is False
    assert api.set_privacy(user) is False
    assert not PrivacySettings.objects.exists()

    assert api.set_privacy(user, online_visibility="nobody") is True
    # The levels not given start from the site's DEFAULT_PRIVACY, as any new row does.
    assert _levels(user) == ("nobody", "everyone", "contacts")
    assert PrivacySettings.objects.get(user=user).invisible is False


@pytest.mark.django_db
def test_set_privacy_writes_only_the_levels_given_and_tells_viewers(
    make_user: Callable[..., Any],
    saved_fields: list[frozenset[str] | None],
    django_capture_on_commit_callbacks: Any,
) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    PrivacySettings.objects.create(user=user, last_seen_visibility="nobody", invisible=True)
    saved_fields.clear()
    sent: list[tuple[Any, str]] = []

    def record(sender: Any, user_id: Any, reason: str, **kwargs: Any) -> None:
        sent.append((user_id, reason))

    presence_changed.connect(record)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert api.set_privacy(user.pk, online_visibility="everyone") is True
            assert api.set_privacy(user, online_visibility="everyone") is False
            # A level given as it is stored is left out of the save.
            assert (
                api.set_privacy(user, online_visibility="everyone", activity_visibility="nobody")
                is True
            )
    finally:
        presence_changed.disconnect(record)
    assert saved_fields == [frozenset({"online_visibility"}), frozenset({"activity_visibility"})]
    assert _levels(user) == ("everyone", "nobody", "nobody")
    assert PrivacySettings.objects.get(user=user).invisible is True  # not touched
    assert sent == [(user.pk, "privacy"), (user.pk, "privacy")]


@pytest.mark.django_db
def test_set_privacy_level_decides_what_a_viewer_sees(make_user: Callable[..., Any]) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    api.touch(user)
    assert api.get_presence(user, contact).status is Status.ONLINE
    api.set_privacy(user, online_visibility="nobody")
    assert api.get_presence(user, contact).status is Status.OFFLINE
    api.set_privacy(user, online_visibility="contacts")
    assert api.get_presence(user, contact).status is Status.ONLINE


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("levels", "named"),
    [
        ({"online": "nobody"}, "online"),
        ({"invisible": True}, "set_invisible"),
        ({"online_visibility": "friends"}, "online_visibility"),
        ({"online_visibility": None}, "online_visibility"),
        # The first level is fine: nothing is saved of it either.
        ({"online_visibility": "nobody", "last_seen_visibility": "all"}, "last_seen_visibility"),
    ],
)
def test_set_privacy_refuses_bad_input_naming_it_and_saves_nothing(
    make_user: Callable[..., Any], levels: dict[str, Any], named: str
) -> None:
    user = make_user()
    with pytest.raises(InvalidInput) as raised:
        api.set_privacy(user, **levels)
    assert raised.value.code == "invalid_value"
    assert named in raised.value.message
    assert not PrivacySettings.objects.exists()


@pytest.mark.django_db
def test_set_privacy_and_set_invisible_refuse_an_id_of_no_user(
    make_user: Callable[..., Any],
) -> None:
    for write in (
        lambda: api.set_privacy(UNKNOWN_ID, online_visibility="nobody"),
        lambda: api.set_invisible(UNKNOWN_ID, True),
    ):
        with pytest.raises(InvalidInput) as raised:
            write()
        assert raised.value.code == "unknown_users"
    assert not PrivacySettings.objects.exists()


# --- set_invisible -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_set_invisible_keeps_the_status_and_redis_follows(
    make_user: Callable[..., Any], clock: Any
) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    PrivacySettings.objects.create(user=user, activity_visibility="everyone")
    api.set_status(user, "dnd", text="Selling bikes", emoji="🚲")
    api.touch(user)
    assert api.online_count() == 1

    assert api.set_invisible(user, True) is True
    assert api.set_invisible(user, True) is False
    own = api.get_presence(user, user)
    assert (own.invisible, own.text, own.emoji) == (True, "Selling bikes", "🚲")
    assert api.get_presence(user, contact).status is Status.OFFLINE
    # Redis's copy, after the commit: the online count leaves the user out.
    assert get_store().run(get_store().plans.invisible_members()) == {user.pk}
    assert api.online_count() == 0

    assert api.set_invisible(user, False) is True
    assert api.get_presence(user, contact).status is Status.DND  # do not disturb, as before
    assert UserStatus.objects.get(user=user).text == "Selling bikes"
    assert get_store().run(get_store().plans.invisible_members()) == set()
    assert api.online_count() == 1


@pytest.mark.django_db
def test_set_invisible_answers_whether_it_changed_anything(
    make_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": {"online_visibility": "everyone"}}
    user = make_user()
    # No row: visible already, and no row is made for it.
    assert api.set_invisible(user, False) is False
    assert not PrivacySettings.objects.exists()
    assert api.set_invisible(user, True) is True
    row = PrivacySettings.objects.get(user=user)
    assert (row.invisible, row.online_visibility) == (True, "everyone")
    assert api.set_invisible(user.pk, False) is True
    assert PrivacySettings.objects.get(user=user).invisible is False
    with pytest.raises(InvalidInput) as raised:
        api.set_invisible(user, "yes")  # type: ignore[arg-type]
    assert raised.value.code == "invalid_value"
    assert "invisible" in raised.value.message
    assert PrivacySettings.objects.get(user=user).invisible is False


@pytest.mark.django_db(transaction=True)
def test_set_invisible_rolled_back_reaches_nothing(make_user: Callable[..., Any]) -> None:
    user = make_user()
    api.touch(user)
    with pytest.raises(RuntimeError), transaction.atomic():
        api.set_invisible(user, True)
        raise RuntimeError("the site's view failed")
    assert not PrivacySettings.objects.exists()
    assert get_store().run(get_store().plans.invisible_members()) == set()
    assert api.online_count() == 1


# --- online_among ------------------------------------------------------------------------------


def _online_among_cases(make_user: Callable[..., Any]) -> dict[str, Any]:
    """A viewer, and users who are online but hidden from them each another way, and two it
    may see online: everyone touched now but ``offline``."""
    names = ("viewer", "shown", "also_shown", "blocked", "blocking", "invisible", "nobody")
    users = {name: make_user() for name in (*names, "offline")}
    viewer = users["viewer"]
    for name in names[1:]:
        Contact.objects.create(owner=users[name], contact=viewer)  # they let the viewer see
    Contact.objects.create(owner=users["offline"], contact=viewer)
    Block.objects.create(blocker=viewer, blocked=users["blocked"])
    Block.objects.create(blocker=users["blocking"], blocked=viewer)
    PrivacySettings.objects.create(user=users["invisible"], invisible=True)
    PrivacySettings.objects.create(user=users["nobody"], online_visibility="nobody")
    for name in names:
        api.touch(users[name])
    return users


@pytest.mark.django_db
def test_online_among_keeps_the_order_and_hides_what_privacy_hides(
    make_user: Callable[..., Any], clock: Any
) -> None:
    users = _online_among_cases(make_user)
    given = [
        users[name]
        for name in ("also_shown", "blocked", "invisible", "shown", "nobody", "blocking")
    ]
    given += [users["offline"], UNKNOWN_ID, users["also_shown"]]
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        online = api.online_among(given, users["viewer"])
    assert online == [users["also_shown"], users["shown"]]  # as given, each once
    assert (len(queries), trips.count) == (1, 1)  # bulk_presence's read
    # Ids in, ids out; an anonymous viewer is a stranger (contacts only: nobody shows).
    ids = [users["shown"].pk, users["blocked"].pk, users["also_shown"].pk]
    assert api.online_among(ids, users["viewer"].pk) == [ids[0], ids[2]]
    assert api.online_among(ids, None) == []
    assert api.online_among([], users["viewer"]) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_aonline_among(make_user: Callable[..., Any], clock: Any) -> None:
    users = await sync_to_async(_online_among_cases)(make_user)
    try:
        given = [users[name] for name in ("nobody", "shown", "invisible", "also_shown")]
        assert await api.aonline_among(given, users["viewer"]) == [
            users["shown"],
            users["also_shown"],
        ]
    finally:
        await get_store().aclose()


# --- the async twins, told on an open socket ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_aset_invisible_and_aset_privacy_reach_open_sockets(
    sockets: Any, settings: Any, make_user: Callable[..., Any]
) -> None:
    from tests.live.sockets import BASE, receive, subscribe

    settings.PRESENCE = dict(BASE)
    alice, carol = await sync_to_async(make_user)(), await sync_to_async(make_user)()

    @sync_to_async
    def arrange() -> None:
        Contact.objects.create(owner=alice, contact=carol)
        PrivacySettings.objects.create(user=alice, activity_visibility="everyone")
        api.set_status(alice, "auto", text="Selling bikes")

    await arrange()
    await sockets.open(alice)
    carol_tab = await sockets.open(carol)
    seen = (await subscribe(carol_tab, alice))["presences"][str(alice.pk)]
    assert (seen["status"], seen["text"]) == ("online", "Selling bikes")

    assert await api.aset_invisible(alice, True) is True
    changed = (await receive(carol_tab))["presences"][str(alice.pk)]
    assert (changed["status"], changed["text"]) == ("offline", "Selling bikes")

    assert await api.aset_invisible(alice, False) is True
    changed = (await receive(carol_tab))["presences"][str(alice.pk)]
    assert (changed["status"], changed["text"]) == ("online", "Selling bikes")

    assert await api.aset_privacy(alice, online_visibility="nobody") is True
    changed = (await receive(carol_tab))["presences"][str(alice.pk)]
    assert changed["status"] == "offline"
