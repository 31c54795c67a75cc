"""The activity feed's live timelines over the presence WebSocket (``watch_feed``): a new post
reaches the connections whose open timeline it belongs on and whose viewer may see it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence import api, consumers, domain, extensions
from presence.domain import InvalidInput
from presence.feed import api as feed
from presence.feed import live
from presence.feed.models import Group
from presence.models import Block, Contact, PrivacySettings
from tests.feed_cases import (
    CONTACTS_READ_USERS,
    MEMBERS_READ_GROUPS,
    RECORDED_MEMBERS_READ_GROUPS,
    STAFF_READ_GROUPS,
    rule_calls,
)
from tests.ids import missing_id, uid
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    Stall,
    assert_silent,
    error,
    new_user,
    open_sockets,
    receive,
    state,
    subscribe,
)

pytestmark = [pytest.mark.uuid_site, pytest.mark.pubsub_layer]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


async def watch(communicator: Any, *feeds: str) -> None:
    for name in feeds:
        await communicator.send_json_to({"type": "watch_feed", "feed": name})
    # Frames are handled in order: an answered (empty) subscribe means the watches were.
    assert await subscribe(communicator) == state({})


post = sync_to_async(feed.post)


async def activity_frame(communicator: Any) -> tuple[list[str], str, str]:
    frame = await receive(communicator)
    assert frame["type"] == "activity", frame
    return frame["feeds"], frame["activity"]["author"]["username"], frame["activity"]["text"]


@sync_to_async
def follow(owner: Any, contact: Any) -> None:
    Contact.objects.create(owner=owner, contact=contact)


async def test_a_followed_users_post_appears_on_the_following_timeline(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer = await new_user(make_user, username="viewer")
    author = await new_user(make_user, username="author")
    stranger = await new_user(make_user, username="stranger")
    await follow(viewer, author)
    await follow(author, viewer)  # the author lets its contacts see its activity (the default)
    socket = await sockets.open(viewer)
    await watch(socket, "following")

    await post(author, "Hello @viewer")
    assert await activity_frame(socket) == (["following"], "author", "Hello @viewer")
    await post(stranger, "not followed")
    await assert_silent(socket)


async def test_each_timeline_gets_what_belongs_on_it(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer = await new_user(make_user, username="viewer")
    author = await new_user(make_user, username="author")
    await sync_to_async(PrivacySettings.objects.create)(user=author, activity_visibility="everyone")
    group = await sync_to_async(Group.objects.create)(name="Climbers", slug="climbers")
    await sync_to_async(feed.join)(author, group)
    socket = await sockets.open(viewer)
    await watch(socket, "mentions", f"user:{author.pk}", "group:climbers")

    await post(author, "for @viewer")
    assert await activity_frame(socket) == (
        sorted(["mentions", f"user:{author.pk}", "group:climbers"]),
        "author",
        "for @viewer",
    )
    await sync_to_async(feed.leave)(author, group)
    await post(author, "after leaving")
    assert await activity_frame(socket) == ([f"user:{author.pk}"], "author", "after leaving")


async def test_privacy_and_blocks_decide_who_sees_a_post(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    author = await new_user(make_user, username="author")
    contact = await new_user(make_user, username="contact")
    stranger = await new_user(make_user, username="stranger")
    blocked = await new_user(make_user, username="blocked")
    for viewer in (contact, stranger, blocked):
        await follow(viewer, author)
    await follow(author, contact)
    await follow(author, blocked)
    await sync_to_async(Block.objects.create)(blocker=author, blocked=blocked)
    sockets_by_viewer = {
        viewer: await sockets.open(viewer) for viewer in (contact, stranger, blocked)
    }
    for socket in sockets_by_viewer.values():
        await watch(socket, "following", f"user:{author.pk}")

    await post(author, "contacts only")  # the default activity_visibility
    assert await activity_frame(sockets_by_viewer[contact]) == (
        sorted(["following", f"user:{author.pk}"]),
        "author",
        "contacts only",
    )
    await assert_silent(sockets_by_viewer[stranger], sockets_by_viewer[blocked])

    await sync_to_async(PrivacySettings.objects.create)(user=author, activity_visibility="nobody")
    await post(author, "nobody")
    await assert_silent(*sockets_by_viewer.values())


async def test_exceptions_for_the_activity_decide_who_sees_a_post_live(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """A "never share" exception for the activity beats the contacts level, an "always share"
    admits a stranger: live as on the timelines (feed.visible_to) and in can_see."""
    author = await new_user(make_user, username="author")
    denied = await new_user(make_user, username="denied")
    admitted = await new_user(make_user, username="admitted")
    for viewer in (denied, admitted):
        await follow(viewer, author)
    await follow(author, denied)  # a contact: the default level would admit them
    share = sync_to_async(api.share_with)
    await share(author, denied, "activity_visibility", allow=False)
    await share(author, admitted, "activity_visibility", allow=True)
    by_viewer = {viewer: await sockets.open(viewer) for viewer in (denied, admitted)}
    for socket in by_viewer.values():
        await watch(socket, "following", f"user:{author.pk}")

    posted = await post(author, "for some")

    assert await activity_frame(by_viewer[admitted]) == (
        sorted(["following", f"user:{author.pk}"]),
        "author",
        "for some",
    )
    await assert_silent(by_viewer[denied])
    assert not await feed.acan_see(denied, posted)
    assert await feed.acan_see(admitted, posted)


async def test_a_watcher_that_reads_nothing_holds_up_no_other_watchers_activity(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a server whose send waits (uvicorn, a client not reading), an activity frame to a
    client that reads nothing waits up to SEND_TIMEOUT: the others watching on the process get
    it and the next ones meanwhile, and the slow client's own come in order once it reads."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)  # longer than any wait here
    author = await new_user(make_user, username="author")
    await sync_to_async(PrivacySettings.objects.create)(user=author, activity_visibility="everyone")
    stall = Stall("activity")
    slow = sockets.make(await new_user(make_user, username="slow"), app=stall.app())
    assert (await slow.connect(timeout=TIMEOUT))[0]
    # The slow one watches first: the first the delivery comes to.
    await watch(slow, f"user:{author.pk}")
    fast = await sockets.open(await new_user(make_user, username="fast"))
    await watch(fast, f"user:{author.pk}")
    stall.armed.set()

    await post(author, "one")
    assert (await activity_frame(fast))[2] == "one"
    await asyncio.wait_for(stall.held.wait(), TIMEOUT)  # the slow client's send is held
    await post(author, "two")
    assert (await activity_frame(fast))[2] == "two"
    assert not stall.drained.is_set()
    stall.drained.set()
    assert (await activity_frame(slow))[2] == "one"
    assert (await activity_frame(slow))[2] == "two"
    await assert_silent(fast, slow)


async def watch_after(communicator: Any, feed_name: str, after: int) -> dict[str, Any]:
    """A watch_feed with "after": its answer, the missed_activities frame."""
    await communicator.send_json_to({"type": "watch_feed", "feed": feed_name, "after": after})
    frame = await receive(communicator)
    assert frame["type"] == "missed_activities" and frame["feed"] == feed_name, frame
    return frame


def texts(frame: dict[str, Any]) -> list[str]:
    return [activity["text"] for activity in frame["activities"]]


async def test_a_watch_after_an_activity_is_sent_what_was_posted_since(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """A page whose socket was down (or that was rendered before its watch was answered) names
    the newest activity it shows: the answer holds what the timeline shows since, oldest
    first, read as the timeline is (its rules and privacy), then new ones come live."""
    viewer = await new_user(make_user, username="viewer")
    author = await new_user(make_user, username="author")
    hidden = await new_user(make_user, username="hidden")
    stranger = await new_user(make_user, username="stranger")
    for followed in (author, hidden):
        await follow(viewer, followed)
    await follow(author, viewer)  # the author lets its contacts see its activity (the default)
    socket = await sockets.open(viewer)
    await watch(socket, "following")
    one = await post(author, "one")
    assert (await activity_frame(socket))[2] == "one"
    await sockets.close(socket)  # the page's socket is down a while
    await post(author, "two (while away)")
    await post(hidden, "not for the viewer")  # hidden's contacts only: the viewer is not one
    await post(stranger, "not followed")
    await post(author, "three (while away)")

    again = await sockets.open(viewer)
    missed = await watch_after(again, "following", one.pk)
    assert texts(missed) == ["two (while away)", "three (while away)"]
    assert missed["reload"] is False
    assert missed["activities"][0]["author"]["username"] == "author"
    four = await post(author, "four")
    assert (await activity_frame(again))[2] == "four"
    # Asked again, on a timeline watched already: answered all the same.
    assert texts(await watch_after(again, "following", one.pk))[-1] == "four"
    assert await watch_after(again, "following", four.pk) == {
        "type": "missed_activities",
        "feed": "following",
        "activities": [],
        "reload": False,
    }
    await assert_silent(again)


async def test_more_missed_than_a_page_holds_tells_the_page_to_reload(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "MISSED_LIMIT", 2)
    viewer = await new_user(make_user, username="viewer")
    author = await new_user(make_user, username="author")
    await sync_to_async(PrivacySettings.objects.create)(user=author, activity_visibility="everyone")
    first = await post(author, "seen")
    posted = [await post(author, text) for text in ("a", "b")]
    socket = await sockets.open(viewer)
    name = f"user:{author.pk}"
    assert texts(await watch_after(socket, name, first.pk)) == ["a", "b"]  # as many as fit
    await post(author, "c")
    assert (await activity_frame(socket))[2] == "c"
    assert await watch_after(socket, name, first.pk) == {
        "type": "missed_activities",
        "feed": name,
        "activities": [],
        "reload": True,
    }
    # 0: the page showed none of the timeline.
    assert (await watch_after(socket, "mentions", 0))["activities"] == []
    # An id no longer stored is placed by its number.
    gone = posted[1].pk
    await sync_to_async(posted[1].delete)()
    assert texts(await watch_after(socket, name, gone)) == ["c"]


async def test_a_bad_after_is_refused_naming_the_feed(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    socket = await sockets.open(await new_user(make_user))
    for after in (-1, "5", 1.5, True, 2**63):
        await socket.send_json_to({"type": "watch_feed", "feed": "following", "after": after})
        assert await receive(socket) == error(
            "invalid_value",
            "'after' must be the id of an activity (a whole number, 0 for none).",
            feed="following",
            answers="watch_feed",
        )


async def test_unwatching_stops_and_bad_feeds_are_errors(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer = await new_user(make_user, username="viewer")
    author = await new_user(make_user, username="author")
    await follow(viewer, author)
    await follow(author, viewer)
    socket = await sockets.open(viewer)

    # Each error names the feed as the frame sent it (where it was a string): errors carry no
    # request id, and a client tells them from the answer of its set_status so.
    for frame, expected in [
        (
            {"feed": 3},
            error(
                "invalid_message",
                "'feed' must be a string: following, mentions, user:<id> or group:<slug>.",
            ),
        ),
        (
            {"feed": "everything"},
            error(
                "invalid_value",
                "Unknown feed 'everything': use following, mentions, user:<id> or group:<slug>.",
                feed="everything",
            ),
        ),
        (
            # A final line break was once accepted as a timeline of its own, which never showed
            # anything (found by tests/live/test_fuzz_consumer.py).
            {"feed": "following\n"},
            error(
                "invalid_value",
                "Unknown feed 'following\\n': use following, mentions, user:<id> or group:<slug>.",
                feed="following\n",
            ),
        ),
        (
            {"feed": "group:nope"},
            error("unknown_feed", "No such timeline: group:nope.", feed="group:nope"),
        ),
        (
            {"feed": f"user:{missing_id()}"},
            error(
                "unknown_feed",
                f"No such timeline: user:{missing_id()}.",
                feed=f"user:{missing_id()}",
            ),
        ),
        (
            # As sent, not as the timeline's canonical name (a UUID in lowercase).
            {"feed": f"user:{str(missing_id()).upper()}"},
            error(
                "unknown_feed",
                f"No such timeline: user:{missing_id()}.",
                feed=f"user:{str(missing_id()).upper()}",
            ),
        ),
    ]:
        await socket.send_json_to({"type": "watch_feed", **frame})
        assert await receive(socket) == {**expected, "answers": "watch_feed"}

    await socket.send_json_to({"type": "unwatch_feed", "feed": "user:abc"})
    assert await receive(socket) == error(
        "invalid_value",
        "Unknown feed 'user:abc': use following, mentions, user:<id> or group:<slug>.",
        feed="user:abc",
        answers="unwatch_feed",
    )
    await watch(socket, "following")
    await socket.send_json_to({"type": "unwatch_feed", "feed": "following"})
    assert await subscribe(socket) == state({})
    await post(author, "unseen")
    await assert_silent(socket)


async def test_a_private_groups_timeline_is_watched_by_its_members_only(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """PRESENCE_FEED["CAN_READ"] decides who may watch a timeline, as who may read it over
    HTTP: a refusal is answered as a group that does not exist (which private groups exist is
    not told), and the group's posts never reach the one refused."""
    settings.PRESENCE_FEED = {"CAN_READ": MEMBERS_READ_GROUPS}
    member = await new_user(make_user, username="member")
    outsider = await new_user(make_user, username="outsider")
    await sync_to_async(PrivacySettings.objects.create)(user=member, activity_visibility="everyone")
    group = await sync_to_async(Group.objects.create)(name="Secret", slug="secret-board")
    await sync_to_async(feed.join)(member, group)
    inside, outside = await sockets.open(member), await sockets.open(outsider)
    for name in ("group:secret-board", "group:no-such-board"):
        await outside.send_json_to({"type": "watch_feed", "feed": name})
        assert await receive(outside) == error(
            "unknown_feed", f"No such timeline: {name}.", feed=name, answers="watch_feed"
        )
    await watch(inside, "group:secret-board")
    await post(member, "members only: the plan")
    assert await activity_frame(inside) == (
        ["group:secret-board"],
        "member",
        "members only: the plan",
    )
    await assert_silent(outside)


async def test_a_watch_again_asks_the_rule_again_and_a_refusal_unwatches(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A member removed from a private group whose page still watches it, watching it again
    with "after": 0, was sent the group's whole timeline as it is now (the rule was asked of
    new watches only): it is refused as a new watch is, and the timeline is unwatched."""
    settings.PRESENCE_FEED = {"CAN_READ": MEMBERS_READ_GROUPS}
    member = await new_user(make_user, username="member")
    removed = await new_user(make_user, username="removed")
    later = await new_user(make_user, username="later")
    for user in (member, later):
        await sync_to_async(PrivacySettings.objects.create)(
            user=user, activity_visibility="everyone"
        )
    group = await sync_to_async(Group.objects.create)(name="Secret", slug="secret-board")
    for user in (member, removed):
        await sync_to_async(feed.join)(user, group)
    socket = await sockets.open(removed)
    name = "group:secret-board"
    await watch(socket, name)
    await watch(socket, name)  # again, still a member: nothing to answer
    await sync_to_async(feed.leave)(removed, group)
    # Asked again at once (recheck_watches): unwatched and told, unasked (no "answers").
    assert await receive(socket) == error("unknown_feed", f"No such timeline: {name}.", feed=name)
    await post(later, "later's post from before joining")  # on the group's timeline once joined
    await sync_to_async(feed.join)(later, group)
    await post(member, "the plan, made after the removal")
    refused = error("unknown_feed", f"No such timeline: {name}.", feed=name, answers="watch_feed")
    for frame in ({"after": 0}, {}):  # with "after" or without, and again once unwatched
        await socket.send_json_to({"type": "watch_feed", "feed": name, **frame})
        assert await receive(socket) == refused
    await post(member, "after the refusal")
    await assert_silent(socket)


@sync_to_async
def set_staff(user: Any, is_staff: bool) -> None:
    user.is_staff = is_staff
    user.save(update_fields=["is_staff"])  # (no session check: only is_staff changed)


async def test_a_watch_again_of_a_watched_timeline_the_site_now_refuses_unwatches_it(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A rule on the site's own facts, changed without recheck_watches: the page keeps the
    posts until it watches again, and that watch is refused and unwatches the timeline."""
    settings.PRESENCE_FEED = {"CAN_READ": STAFF_READ_GROUPS}
    author = await new_user(make_user, username="author")
    viewer = await new_user(make_user, username="viewer", is_staff=True)
    await sync_to_async(PrivacySettings.objects.create)(user=author, activity_visibility="everyone")
    group = await sync_to_async(Group.objects.create)(name="Algebra", slug="algebra")
    await sync_to_async(feed.join)(author, group)
    socket = await sockets.open(viewer)
    await watch(socket, "group:algebra")
    await set_staff(viewer, False)
    await post(author, "before the watch again")
    assert (await activity_frame(socket))[2] == "before the watch again"
    await socket.send_json_to({"type": "watch_feed", "feed": "group:algebra", "after": 0})
    assert await receive(socket) == error(
        "unknown_feed",
        "No such timeline: group:algebra.",
        feed="group:algebra",
        answers="watch_feed",
    )
    await post(author, "after the refusal")
    await assert_silent(socket)


async def private_group(make_user: Callable[..., Any]) -> tuple[Any, Any, Any, Any]:
    """Algebra, a private group of alice (who posts for everyone), bob and carol."""
    alice = await new_user(make_user, username="alice", is_staff=True)
    bob = await new_user(make_user, username="bob", is_staff=True)
    carol = await new_user(make_user, username="carol", is_staff=True)
    await sync_to_async(PrivacySettings.objects.create)(user=alice, activity_visibility="everyone")
    group = await sync_to_async(Group.objects.create)(name="Algebra", slug="algebra")
    for user in (alice, bob, carol):
        await sync_to_async(feed.join)(user, group)
    return alice, bob, carol, group


ALGEBRA_GONE = error("unknown_feed", "No such timeline: group:algebra.", feed="group:algebra")


async def test_a_member_who_leaves_stops_watching_the_group_on_every_connection_at_once(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """feed.leave of a private group: every connection of the member watching its timeline is
    asked CAN_READ again at once, unwatched and told unknown_feed; their other timelines and
    the members still in are untouched (the removed member kept the live posts until a reload,
    reconnect or watch again)."""
    settings.PRESENCE_FEED = {"CAN_READ": MEMBERS_READ_GROUPS}
    alice, bob, carol, group = await private_group(make_user)
    first, second = await sockets.open(bob), await sockets.open(bob)
    stays = await sockets.open(carol)
    await watch(first, "group:algebra", f"user:{alice.pk}")
    await watch(second, "group:algebra")
    await watch(stays, "group:algebra")
    await sync_to_async(feed.leave)(bob, group)
    for socket in (first, second):
        assert await receive(socket) == ALGEBRA_GONE
    await post(alice, "the answers to sheet 3")
    assert await activity_frame(first) == ([f"user:{alice.pk}"], "alice", "the answers to sheet 3")
    assert await activity_frame(stays) == (["group:algebra"], "alice", "the answers to sheet 3")
    await assert_silent(first, second, stays)


async def test_a_membership_deleted_in_the_admin_or_a_group_renamed_or_deleted_is_asked_again(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A Membership row deleted (the admin's inline) ends the watch as feed.leave does; a group
    renamed or deleted ends every watch of its name, whatever the rule (it names nothing)."""
    settings.PRESENCE_FEED = {"CAN_READ": MEMBERS_READ_GROUPS}
    _, bob, carol, group = await private_group(make_user)
    of_bob, of_carol = await sockets.open(bob), await sockets.open(carol)
    await watch(of_bob, "group:algebra")
    await watch(of_carol, "group:algebra")
    await sync_to_async(lambda: group.memberships.get(user=bob).delete())()
    assert await receive(of_bob) == ALGEBRA_GONE
    await assert_silent(of_carol)
    settings.PRESENCE_FEED = {}
    group.slug = "algebra-2"  # renamed: group:algebra names nothing now
    await sync_to_async(group.save)()
    assert await receive(of_carol) == ALGEBRA_GONE
    await watch(of_carol, "group:algebra-2")
    await sync_to_async(group.delete)()
    assert await receive(of_carol) == error(
        "unknown_feed", "No such timeline: group:algebra-2.", feed="group:algebra-2"
    )
    await assert_silent(of_bob)


async def test_recheck_watches_asks_the_sites_rule_again(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A site whose own facts changed (is_staff, which the feed does not watch) calls
    feed.recheck_watches(user): that user's watches refused are ended on each connection;
    the others' are not asked, and what is still allowed stays watched."""
    settings.PRESENCE_FEED = {"CAN_READ": STAFF_READ_GROUPS}
    alice, bob, carol, _ = await private_group(make_user)
    first, second, stays = [await sockets.open(user) for user in (bob, bob, carol)]
    for socket in (first, second, stays):
        await watch(socket, "group:algebra", f"user:{alice.pk}")
    await set_staff(bob, False)
    await set_staff(carol, False)  # (not rechecked: carol's page keeps watching)
    await sync_to_async(feed.recheck_watches)(bob)
    for socket in (first, second):
        assert await receive(socket) == ALGEBRA_GONE
    await post(alice, "sheet 4")
    for socket in (first, second):
        assert await activity_frame(socket) == ([f"user:{alice.pk}"], "alice", "sheet 4")
    everywhere = sorted(["group:algebra", f"user:{alice.pk}"])
    assert await activity_frame(stays) == (everywhere, "alice", "sheet 4")
    await assert_silent(first, second, stays)
    # The async twin, for one timeline of every watcher.
    await feed.arecheck_watches(None, feeds=["group:algebra"])
    assert await receive(stays) == ALGEBRA_GONE
    await assert_silent(first, second, stays)


async def test_a_contact_removed_is_asked_again(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A rule on presence's contacts (a user's timeline to their contacts): the contact the
    owner removes stops watching it at once."""
    settings.PRESENCE_FEED = {"CAN_READ": CONTACTS_READ_USERS}
    owner = await new_user(make_user, username="owner")
    friend = await new_user(make_user, username="friend")
    await follow(owner, friend)
    socket = await sockets.open(friend)
    name = f"user:{owner.pk}"
    await watch(socket, name)
    await sync_to_async(api.unfollow)(owner, friend)
    assert await receive(socket) == error("unknown_feed", f"No such timeline: {name}.", feed=name)


async def test_the_rule_is_asked_whether_or_not_the_timeline_exists(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    """A refused group is answered as a missing one and costs what one does: the rule is asked
    of both (it ran for existing groups only, its queries telling which private groups exist)."""
    settings.PRESENCE_FEED = {"CAN_READ": RECORDED_MEMBERS_READ_GROUPS}
    outsider = await new_user(make_user, username="outsider")
    await sync_to_async(Group.objects.create)(name="Secret", slug="secret-board")
    socket = await sockets.open(outsider)
    nobody = f"user:{missing_id()}"
    names = ["group:secret-board", "group:no-such-board", nobody]
    rule_calls.clear()
    for name in names:
        await socket.send_json_to({"type": "watch_feed", "feed": name})
        assert await receive(socket) == error(
            "unknown_feed", f"No such timeline: {name}.", feed=name, answers="watch_feed"
        )
    assert rule_calls == [(outsider.pk, name) for name in names]


async def test_a_failed_watch_names_its_feed_and_other_errors_name_none(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    viewer = await new_user(make_user)
    socket = await sockets.open(viewer)

    def broken(feed_name: str) -> bool:
        raise RuntimeError("a bug below the handler")

    monkeypatch.setattr(feed, "feed_exists", broken)
    await socket.send_json_to({"type": "watch_feed", "feed": "mentions"})
    assert await receive(socket) == error(
        "internal_error",
        "The server failed to handle this frame; try again later.",
        feed="mentions",
        answers="watch_feed",
    )
    monkeypatch.undo()
    # The next frame's error is its own: no feed.
    await socket.send_json_to({"type": "set_status", "status": "away"})
    reply = await receive(socket)
    assert reply["code"] == "invalid_value" and "feed" not in reply, reply
    assert reply["answers"] == "set_status"


async def test_a_connection_watches_at_most_ten_timelines(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer = await new_user(make_user)
    users = [await new_user(make_user) for _ in range(10)]
    socket = await sockets.open(viewer)
    await watch(socket, *(f"user:{user.pk}" for user in users))
    await socket.send_json_to({"type": "watch_feed", "feed": "mentions"})
    assert await receive(socket) == error(
        "too_many_feeds",
        "At most 10 live timelines per connection.",
        feed="mentions",
        answers="watch_feed",
    )


LIMITS = domain.Limits(text_max_length=10, emoji_max_length=4, max_expiry=3600)


def parse(data: dict[str, Any]) -> Any:
    """A frame through presence's parser with the frame types installed apps registered."""
    return domain.parse_frame(json.dumps(data), LIMITS, extensions.frame_parsers())


class TestParseFeedFrames:
    @pytest.mark.parametrize(
        "feed", ["following", "mentions", f"user:{uid(12)}", "group:climb-ers_2"]
    )
    def test_watch_and_unwatch(self, feed: str) -> None:
        assert parse({"type": "watch_feed", "feed": feed}) == domain.Extension(
            "watch_feed", live.WatchFeed(feed)
        )
        assert parse({"type": "unwatch_feed", "feed": feed}) == domain.Extension(
            "unwatch_feed", live.UnwatchFeed(feed)
        )

    @pytest.mark.parametrize(
        ("feed", "code"),
        [
            (None, "invalid_message"),
            (3, "invalid_message"),
            (["following"], "invalid_message"),
            ("", "invalid_value"),
            ("Following", "invalid_value"),
            ("user:0", "invalid_value"),
            ("user:abc", "invalid_value"),
            ("group:", "invalid_value"),
            ("group:a b", "invalid_value"),
            ("following ", "invalid_value"),
            # A final line break once passed ("$" matches before it): found by the fuzz test.
            ("following\n", "invalid_value"),
            ("mentions\n", "invalid_value"),
            ("group:climbers\n", "invalid_value"),
            (f"user:{uid(12)}\n", "invalid_value"),
        ],
    )
    def test_bad_feed_names(self, feed: Any, code: str) -> None:
        with pytest.raises(InvalidInput) as raised:
            parse({"type": "watch_feed", "feed": feed})
        assert raised.value.code == code
