"""Property-based fuzzing of the WebSocket consumer (hypothesis): FRAMES_PER_RUN frames of every
type a client may send, well-formed and not, through WebsocketCommunicator, the real
channels_redis layer and a real Redis.

Every frame must leave the socket open and the consumer running, be answered exactly as
docs/websocket.md says (nothing, a snapshot, a status or one error frame, each of a documented
shape), log no error, and change nothing of any other user: their Redis state, their database
rows, what their open connection was last sent and what it watches.

What each frame should get is computed here from the protocol (:func:`expected`), without
presence's parser, so that a mistake in the parser cannot hide behind the same mistake here.
The consumer runs on the test's event loop; hypothesis runs in a worker thread and hands each
example's frames to that loop. A few connections stay open for the whole run and each example
sends them a batch of frames: opening a connection per frame would cost more than the frames.


The model of the protocol the answers are checked against: tests/live/fuzz_model.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from channels.security.websocket import OriginValidator
from django.test import override_settings
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from presence import api, users
from presence.models import Block, Contact, PrivacySettings
from tests.fuzz_cases import MAX_INT_ID, SCALE, SEED, odd_text, redis_of_others
from tests.live.fuzz_model import (
    ANSWERS_SUBSCRIBE,
    ERROR_CODES,
    MAX_SUBSCRIPTIONS,
    SENTINEL,
    ConnectionModel,
    Expectation,
    Fuzzer,
    Site,
    check_error,
    check_presence,
    check_replies,
    check_unprompted,
    consumer_of,
    database_of_others,
    error,
    expected,
    feed_installed,
    frames,
    replies_until,
    views_of,
    weight,
)
from tests.live.sockets import BASE, TIMEOUT, Sockets, new_user, open_sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.fuzz,
]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


#: frames the fuzz sends in one run (sentinels not counted); PRESENCE_FUZZ_SCALE multiplies it
FRAMES_PER_RUN = 10_000 * SCALE
#: frames per hypothesis example (each example is one batch, spread over the fuzzing user's
#: connections)
FRAMES_PER_EXAMPLE = 20
#: the groups of the fuzzed site: with following, mentions and the users' own, more timelines
#: than MAX_FEEDS
GROUPS = ("fuzz-group", *(f"g{n}" for n in range(1, 12)))
#: how long one batch may take to be answered before the consumer counts as stuck
BATCH_TIMEOUT = 60

# --- the fuzz -----------------------------------------------------------------------------------


async def _site_users(make_user: Callable[..., Any]) -> tuple[Any, Any, Any]:
    """The fuzzing user, a friend connected and watching it, and an unrelated user; each with
    state of its own (choices, relations, a group, posts) that the fuzz must not change."""
    fuzzer = await new_user(make_user, username="fuzzer")
    friend = await new_user(make_user, username="friend")
    bystander = await new_user(make_user, username="bystander")

    @sync_to_async
    def relate() -> None:
        Contact.objects.create(owner=fuzzer, contact=friend)
        Contact.objects.create(owner=friend, contact=fuzzer, close_friend=True)
        Contact.objects.create(owner=bystander, contact=friend)
        Block.objects.create(blocker=bystander, blocked=fuzzer)
        PrivacySettings.objects.create(user=fuzzer, online_visibility="everyone")
        PrivacySettings.objects.create(user=friend, last_seen_visibility="nobody")
        api.set_status(friend, "dnd", text="Friend's own status", emoji="\U0001f3a7")
        api.set_status(bystander, "invisible", text="Bystander's")
        if feed_installed():
            from presence.feed import api as feed
            from presence.feed.models import Group

            # More timelines than a connection may watch: too_many_feeds is reachable.
            for slug in GROUPS:
                Group.objects.create(name=slug, slug=slug)
            group = Group.objects.get(slug="fuzz-group")
            feed.join(friend, group)
            feed.join(bystander, group)
            feed.post(friend, "Hello @fuzzer and @bystander")
            feed.post(bystander, "Unrelated")

    await relate()
    await api.atouch(bystander, "mobile")  # online from a page view, not connected
    return fuzzer, friend, bystander


def _site(*site_users: Any) -> tuple[Site, st.SearchStrategy[Any]]:
    """The fuzzed site as the oracle sees it, and ids of its pk kind that name no user."""
    frame_types = {"heartbeat", "subscribe", "unsubscribe", "set_status"}
    if feed_installed():
        frame_types |= {"watch_feed", "unwatch_feed"}
    kind = users.pk_kind()
    site = Site(
        pk_kind=kind,
        existing=frozenset(u.pk for u in site_users),
        groups=frozenset(GROUPS if feed_installed() else ()),
        frame_types=frozenset(frame_types),
    )
    unknown_ids: st.SearchStrategy[Any] = (
        st.integers(min_value=1, max_value=MAX_INT_ID) if kind == "int" else st.uuids().map(str)
    )
    return site, unknown_ids


def _spellings(site_users: tuple[Any, ...]) -> list[Any]:
    """Each user's id as clients may spell it: a number, its text, with a leading zero; a UUID
    in lower and upper case, in braces."""
    spelt: list[Any] = []
    for user in site_users:
        pk = user.pk
        if isinstance(pk, int):
            spelt += [pk, str(pk), f"0{pk}"]
        else:
            spelt += [str(pk), str(pk).upper(), f"{{{pk}}}"]
    return spelt


async def test_fuzzed_frames_are_answered_and_change_no_other_user(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    # HTTP_RATE_LIMIT off: the per-user write budget would answer most set_status frames
    # rate_limited (tests/live/test_socket_write_limit.py tests it).
    with override_settings(PRESENCE={**BASE, "RATE_LIMIT": (10**9, 10), "HTTP_RATE_LIMIT": None}):
        fuzzer, friend, bystander = await _site_users(make_user)
        # The fuzzing user on two devices; its friend watches it and the bystander.
        tabs = [await sockets.open(fuzzer), await sockets.open(fuzzer, "?device=mobile")]
        watcher = await sockets.open(friend)
        await watcher.send_json_to(
            {"type": "subscribe", "users": [_spellings([fuzzer])[0], _spellings([bystander])[0]]}
        )
        assert (await watcher.receive_json_from(timeout=TIMEOUT))["type"] == "presence_state"
        if feed_installed():
            await watcher.send_json_to({"type": "watch_feed", "feed": "group:fuzz-group"})
            # Frames are handled in order: an answered (empty) subscribe means it watches.
            await watcher.send_json_to({"type": "subscribe", "users": []})
            assert await watcher.receive_json_from(timeout=TIMEOUT) == {
                "type": "presence_state",
                "presences": {},
            }
        friend_connection = consumer_of(friend)

        site, unknown_ids = _site(fuzzer, friend, bystander)
        fuzz = Fuzzer(tabs, site)
        others_before = (
            redis_of_others(redis_client, [fuzzer]),
            await database_of_others(fuzzer),
            views_of(friend_connection),
            await api.abulk_presence([friend, bystander], friend),
            await api.abulk_presence([friend, bystander], bystander),
        )

        async def after_batch() -> None:
            # Each connection still open and its consumer running.
            for socket in [*tabs, watcher]:
                assert not socket.future.done(), socket.future
            # The friend was told about the fuzzing user only, never about the bystander.
            while not watcher.output_queue.empty():
                output = watcher.output_queue.get_nowait()
                assert output["type"] == "websocket.send", output
                frame = json.loads(output["text"])
                check_unprompted(frame)
                if frame["type"] == "presence_diff":
                    assert set(frame["presences"]) == {str(_spellings([fuzzer])[0])}, frame
            friend_views = views_of(friend_connection)
            friend_views["sent"].pop(fuzzer.pk, None)
            expected_views = {**others_before[2], "sent": dict(others_before[2]["sent"])}
            expected_views["sent"].pop(fuzzer.pk, None)
            assert friend_views == expected_views
            assert redis_of_others(redis_client, [fuzzer]) == others_before[0]
            assert await database_of_others(fuzzer) == others_before[1]
            assert await api.abulk_presence([friend, bystander], friend) == others_before[3]
            assert await api.abulk_presence([friend, bystander], bystander) == others_before[4]
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert errors == [], [r.getMessage() for r in errors]

        loop = asyncio.get_running_loop()
        failures: list[BaseException] = []

        def on_loop(batch: list[tuple[int, str | bytes]]) -> None:
            async def run() -> None:
                await fuzz.send(batch)
                await after_batch()

            asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=BATCH_TIMEOUT)

        @seed(SEED)
        @settings(
            max_examples=FRAMES_PER_RUN // FRAMES_PER_EXAMPLE,
            deadline=None,
            database=None,
            derandomize=False,
            # No shrinking: the consumer keeps state between examples, so a failing batch is
            # reported as it was sent (its own message names the frame).
            phases=[Phase.explicit, Phase.generate],
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            st.lists(
                st.tuples(
                    st.integers(min_value=0, max_value=1),
                    frames(site, _spellings([fuzzer, friend, bystander]), unknown_ids),
                ),
                min_size=FRAMES_PER_EXAMPLE,
                max_size=FRAMES_PER_EXAMPLE,
            )
        )
        # A feed that does not exist, asked for before the connection's feeds can be full
        # (too_many_feeds comes first): generated batches reach it only by chance.
        @example([(0, '{"type": "watch_feed", "feed": "group:nope"}')])
        def fuzz_batch(batch: list[tuple[int, str | bytes]]) -> None:
            # Hypothesis runs a failing example again to report it; by then the connections
            # have moved on, so the first failure is what it reports.
            if failures:
                raise failures[0]
            try:
                on_loop(batch)
            except BaseException as failure:
                failures.append(failure)
                raise

        started = loop.time()
        await asyncio.to_thread(fuzz_batch)
        elapsed = loop.time() - started
        assert fuzz.answered >= FRAMES_PER_RUN, fuzz.answered
        # Every kind of answer was asked for: well-formed frames of each type and each fault.
        reached = {code for name in fuzz.outcomes for code in name.split("/")}
        assert reached >= {"Silent", "Snapshot", "snapshot+unknown_users", "StatusReply"}
        assert reached >= ERROR_CODES - {"internal_error", "unknown_users"} - (
            set() if feed_installed() else {"unknown_feed", "too_many_feeds"}
        ), fuzz.outcomes
        print(
            f"\n{fuzz.answered} fuzzed frames in {elapsed:.1f} s: {sorted(fuzz.outcomes.items())}"
        )


#: presence's default RATE_LIMIT: 60 frames in any 10 s
RATE_FRAMES = 60
#: connections the rate limit fuzz opens, each flooded with one example's frames
RATE_EXAMPLES = 40 * SCALE


async def test_fuzzed_floods_close_with_4429_exactly_past_the_rate_limit(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the default RATE_LIMIT, any mix of frames is answered as the protocol says until
    the frame that goes past the budget (large subscribes weighing more), which closes the
    socket with 4429 and is the last one answered. The clock stands still: no frame leaves the
    window."""
    caplog.set_level(logging.WARNING)
    with override_settings(
        PRESENCE={**BASE, "RATE_LIMIT": (RATE_FRAMES, 10), "HTTP_RATE_LIMIT": None}
    ):
        fuzzer, friend, bystander = await _site_users(make_user)
        site, unknown_ids = _site(fuzzer, friend, bystander)
        # Subscribes of up to a thousand ids, weighing up to ten frames each.
        heavy = st.builds(
            lambda n, name: json.dumps(
                {"type": name, "users": list(range(1_000_000, 1_000_000 + n))}
            ),
            st.integers(min_value=0, max_value=MAX_SUBSCRIPTIONS),
            st.sampled_from(["subscribe", "unsubscribe"]),
        )
        any_frame = st.one_of(
            frames(site, _spellings([fuzzer, friend, bystander]), unknown_ids), heavy
        )
        loop = asyncio.get_running_loop()
        failures: list[BaseException] = []
        closed_examples = 0
        marks = iter(range(1, 10**9))

        async def flood(batch: list[str | bytes]) -> None:
            nonlocal closed_examples
            socket = await sockets.open(fuzzer)  # its empty subscribe: one frame
            used = 1
            model = ConnectionModel()
            # Each frame, then its sentinel (one frame more): where does the budget end?
            plan: list[tuple[str | bytes, Expectation, int, bool]] = []
            for payload in batch:
                mark = next(marks)
                closes = used + 1 > RATE_FRAMES
                extra = min(weight(payload), RATE_FRAMES) - 1
                if not closes:
                    used += 1
                    closes = extra > 0 and used + extra > RATE_FRAMES
                    used += extra
                answer = expected(payload, model, site) if not closes else error("closed")
                closes_at_sentinel = not closes and used + 1 > RATE_FRAMES
                used += 1
                for text in (payload, SENTINEL % mark):
                    key = "bytes" if isinstance(text, bytes) else "text"
                    await socket.send_input({"type": "websocket.receive", key: text})
                plan.append((payload, answer, mark, closes or closes_at_sentinel))
                if closes or closes_at_sentinel:
                    break
            for payload, answer, mark, closes in plan:
                replies, closed = await replies_until(socket, mark)
                if closes:
                    assert closed == {"type": "websocket.close", "code": 4429}, (payload, closed)
                    if answer != error("closed"):
                        check_replies(replies, answer)
                    else:
                        assert replies == [], (payload, replies)
                    # Nothing more is answered: the connection is gone for presence.
                    await socket.send_input({"type": "websocket.receive", "text": "{}"})
                    assert await socket.receive_nothing(timeout=0.05)
                    closed_examples += 1
                else:
                    assert closed is None, (payload, closed)
                    check_replies(replies, answer)
            assert not socket.future.done()
            await sockets.close(socket)
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert errors == [], [r.getMessage() for r in errors]

        @seed(SEED)
        @settings(
            max_examples=RATE_EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(any_frame, min_size=RATE_FRAMES // 4, max_size=RATE_FRAMES))
        def flood_one_connection(batch: list[str | bytes]) -> None:
            if failures:
                raise failures[0]
            try:
                asyncio.run_coroutine_threadsafe(flood(batch), loop).result(timeout=BATCH_TIMEOUT)
            except BaseException as failure:
                failures.append(failure)
                raise

        await asyncio.to_thread(flood_one_connection)
        # Both kinds of example ran: floods that stayed within the budget and floods past it.
        print(f"\n{closed_examples} of {RATE_EXAMPLES} floods closed with 4429")
        assert 0 < closed_examples < RATE_EXAMPLES, closed_examples


#: handshakes the handshake fuzz makes, each a new connection of a new user
HANDSHAKES = 40 * SCALE
ALLOWED_ORIGIN_HOSTS = ["testserver", "localhost", "127.0.0.1"]
#: User-Agent headers and the device kind each is guessed as (docs/websocket.md, "Device")
USER_AGENTS = {
    b"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) Mobile/15E148": "mobile",
    b"Mozilla/5.0 (Linux; Android 14)": "mobile",
    b"Mozilla/5.0 (X11; Linux x86_64) Chrome/124.0 Electron/30.0.1": "desktop",
    b"Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0": "web",
    b"": "web",
}


#: what a subscription in the opening request may be answered with instead of its snapshot
URL_SUBSCRIPTION_ERRORS = frozenset(
    {"invalid_value", "invalid_message", "too_many_subscriptions", "unknown_users"}
)


async def test_fuzzed_handshakes_are_served_or_closed_as_documented(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any query string (``?device=`` of any bytes, repeated, percent-escaped; ``users`` and
    ``since`` too), User-Agent and Origin: a foreign Origin is closed with 4403; else the
    connection is served, as the asked device kind, or the guessed one after one invalid_value
    error, and a subscription in the URL is answered or refused with the subscribe's errors."""
    caplog.set_level(logging.WARNING)
    loop = asyncio.get_running_loop()
    failures: list[BaseException] = []
    device_value = st.one_of(
        st.sampled_from([b"web", b"mobile", b"desktop", b"Web", b"", b"%77eb", b"toaster"]),
        st.binary(max_size=12),
        odd_text.map(lambda text: text.encode("utf-8", "surrogatepass")),
    )
    query = st.lists(
        st.one_of(
            device_value.map(lambda value: b"device=" + value),
            st.binary(max_size=12),
            st.sampled_from([b"device", b"=", b"&&", b"%", b"%zz", b"device=%ff"]),
            st.sampled_from(
                [b"users=1,x", b"users=%ff", b"users", b"since=1.a", b"users=7&since="]
            ),
        ),
        max_size=3,
    ).map(b"&".join)
    origin = st.one_of(
        st.none(),
        st.sampled_from(
            [
                b"http://testserver",
                b"https://localhost:8000",
                b"http://evil.example",
                b"null",
                b"http://[::1",
                b"http://testserver:99999",
                b"",
            ]
        ),
        st.binary(max_size=16),
    )
    user_agent = st.one_of(st.sampled_from(sorted(USER_AGENTS)), st.binary(max_size=24))

    async def handshake(query: bytes, origin: bytes | None, user_agent: bytes) -> None:
        user = await new_user(make_user)
        headers = [(b"user-agent", user_agent)]
        if origin is not None:
            headers.append((b"origin", origin))
        communicator = sockets.make(user, headers=headers)
        communicator.scope["query_string"] = query
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected  # accepted first, always (browsers see the close code then)
        try:
            parsed = urlparse(origin.decode("latin-1")) if origin is not None else None
        except ValueError:
            foreign = True
        else:
            foreign = parsed is not None and not OriginValidator(
                None, ALLOWED_ORIGIN_HOSTS
            ).valid_origin(parsed)
        if foreign:
            assert await communicator.receive_output(timeout=TIMEOUT) == {
                "type": "websocket.close",
                "code": 4403,
            }
            await sockets.rejected(communicator)
            return
        asked = parse_qs(query.decode("latin-1")).get("device", [None])[0]
        if asked in ("web", "mobile", "desktop"):
            device = asked
        else:
            device = USER_AGENTS.get(user_agent)
            if asked is not None:
                answer = await communicator.receive_json_from(timeout=TIMEOUT)
                check_error(answer, frozenset({"invalid_value"}))
        own_id = _spellings([user])[0]
        await communicator.send_json_to({"type": "subscribe", "users": [own_id]})
        # A query naming users (or since) subscribes in the opening request: its answer, or the
        # subscribe's own errors, come first (docs/websocket.md).
        in_url = {part.partition(b"=")[0] for part in query.split(b"&")} & {b"users", b"since"}
        snapshot = await communicator.receive_json_from(timeout=TIMEOUT)
        while in_url and (
            snapshot["type"] == "error" or str(own_id) not in snapshot.get("presences", {})
        ):
            if snapshot["type"] == "error":
                told = {k: v for k, v in snapshot.items() if k != "users"}  # unknown_users'
                check_error(told, URL_SUBSCRIPTION_ERRORS, ANSWERS_SUBSCRIBE)
            else:
                assert snapshot["type"] == "presence_state", snapshot
            snapshot = await communicator.receive_json_from(timeout=TIMEOUT)
        assert snapshot["type"] == "presence_state", snapshot
        (own,) = snapshot["presences"].values()
        check_presence(own, own=True)
        assert own["status"] == "online", own
        if device is not None:  # else a User-Agent of any bytes: any kind
            assert own["devices"] == [device], (query, user_agent, own)
        assert not communicator.future.done()
        await sockets.close(communicator)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]

    @seed(SEED)
    @settings(
        max_examples=HANDSHAKES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(query, origin, user_agent)
    def fuzz_handshake(query: bytes, origin: bytes | None, user_agent: bytes) -> None:
        if failures:
            raise failures[0]
        try:
            asyncio.run_coroutine_threadsafe(handshake(query, origin, user_agent), loop).result(
                timeout=BATCH_TIMEOUT
            )
        except BaseException as failure:
            failures.append(failure)
            raise

    with override_settings(PRESENCE=BASE):
        await asyncio.to_thread(fuzz_handshake)
