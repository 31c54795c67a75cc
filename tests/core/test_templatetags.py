"""Template tags by exact HTML, in several languages, and what a page of them costs."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.template import Context, Template, TemplateSyntaxError
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import translation

from presence import api, relations, stamps
from presence.domain import Presence, Status
from presence.models import Block, Contact, LastSeen, PrivacySettings
from presence.store import READ_RECENT, get_store
from tests.clock import T0
from tests.privacy_cases import (
    CASE_IDS,
    CASES,
    NOW,
    Case,
    build,
    count_round_trips,
    expected,
    expected_in_online_friends,
)

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

#: the dot's label for each status, per language (written out, not read from the catalogs)
LABELS = {
    "en": {"online": "Online", "idle": "Idle", "dnd": "Do not disturb", "offline": "Offline"},
    "ja": {"online": "オンライン", "idle": "退席中", "dnd": "取り込み中", "offline": "オフライン"},
    "zh-hans": {"online": "在线", "idle": "离开", "dnd": "请勿打扰", "offline": "离线"},
    "vi": {
        "online": "Trực tuyến",
        "idle": "Vắng mặt",
        "dnd": "Không làm phiền",
        "offline": "Ngoại tuyến",
    },
}
NBSP = "\xa0"  # Django's timesince keeps "5 minutes" on one line
#: {% last_seen %} for an online user, and for last seen just now / 5 minutes / 2 hours / 3 days ago
LAST_SEEN = {
    "en": ["online", "just now", f"5{NBSP}minutes ago", f"2{NBSP}hours ago", f"3{NBSP}days ago"],
    "ja": ["オンライン", "たった今", "5分前", "2時間前", "3日前"],
    "zh-hans": ["在线", "刚刚", "5分钟前", "2小时前", "3天前"],
    "vi": [
        "đang hoạt động",
        "vừa xong",
        f"5{NBSP}phút trước",
        f"2{NBSP}giờ trước",
        f"3{NBSP}ngày trước",
    ],
}
#: {% last_seen %} where only the approximate last seen shows (last seen today)
RECENTLY = {
    "en": "last seen recently",
    "ja": "最近オンライン",
    "zh-hans": "最近上线",
    "vi": "truy cập gần đây",
}
LANGUAGES = list(LABELS)


def dot_html(pk: int, status: str, language: str = "en") -> str:
    label = LABELS[language][status]
    return (
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span>'
    )


def request_for(viewer: Any) -> Any:
    request = RequestFactory().get("/")
    request.user = viewer if viewer is not None else AnonymousUser()
    return request


def render(source: str, request: Any = None, **context: Any) -> str:
    """The rendered text, with the page's stamp left out of its dots (every dot must carry the
    request's own: tests/core/test_stamps.py checks the stamp itself)."""
    if request is not None:
        context["request"] = request
    html = Template("{% load presence %}" + source).render(Context(context))
    stamp = stamps.page_stamp(request)
    if stamp is not None:
        html = html.replace(f' data-presence-since="{stamp}"', "")
    assert "data-presence-since" not in html, html
    return html


# --- the privacy matrix through the tags ----------------------------------------------------


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_privacy_matrix(case: Case, make_user: Callable[..., Any]) -> None:
    with time_machine.travel(NOW, tick=False):
        scenario = build(case, make_user)
        target = scenario.target
        html = render(
            "{% presence_dot target %}|{% last_seen target %}|"
            "{% online_friends as friends %}{% for f in friends %}{{ f.pk }};{% endfor %}",
            request_for(scenario.viewer),
            target=target,
        )
    want = expected(case)
    if want.online:
        last_seen = "online"
    elif want.last_seen is not None:
        last_seen = f"2{NBSP}hours ago"  # the offline target was last active 2 hours ago
    elif want.last_seen_approx == "recently":
        last_seen = "last seen recently"  # hidden, not blocked: all but the day
    else:
        last_seen = ""
    friends = f"{target.pk};" if expected_in_online_friends(case) else ""
    assert html == f"{dot_html(target.pk, want.status)}|{last_seen}|{friends}"


# --- presence_dot ---------------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_dot_markup_for_each_status(language: str, make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    online, dnd, offline, idle = (make_user() for _ in range(4))
    for target in (online, dnd, offline, idle):
        Contact.objects.create(owner=target, contact=viewer)
    api.touch(online)
    api.touch(dnd)
    api.set_status(dnd, "dnd")
    request = request_for(viewer)
    # Idle arrives with live connections (the WebSocket issue): put it in the request's
    # presence cache, which is what the tag reads.
    request._presence_cache = {idle.pk: Presence(status=Status.IDLE)}
    with translation.override(language):
        html = render(
            "\n".join("{% presence_dot " + name + " %}" for name in "abcd"),
            request,
            a=online,
            b=dnd,
            c=offline,
            d=idle,
        )
    assert html.split("\n") == [
        dot_html(online.pk, "online", language),
        dot_html(dnd.pk, "dnd", language),
        dot_html(offline.pk, "offline", language),
        dot_html(idle.pk, "idle", language),
    ]


def test_dot_accepts_ids_and_renders_nothing_for_non_users(make_user: Callable[..., Any]) -> None:
    viewer, target = make_user(), make_user()
    Contact.objects.create(owner=target, contact=viewer)
    api.touch(target)
    request = request_for(viewer)
    html = render(
        "{% presence_dot pk %}|{% presence_dot text_pk %}|{% presence_dot none %}|"
        "{% presence_dot anon %}|{% presence_dot junk %}",
        request,
        pk=target.pk,
        text_pk=str(target.pk),
        none=None,
        anon=AnonymousUser(),
        junk="x",
    )
    online = dot_html(target.pk, "online")
    assert html == f"{online}|{online}|||"


@pytest.mark.parametrize("big", [2**63, 2**70, -(2**70), -1])
def test_an_int_beyond_the_ids_names_no_user(big: int, make_user: Callable[..., Any]) -> None:
    # As its text does ("9223372036854775808" is no id): nothing, never a database error.
    viewer, target = make_user(), make_user()
    Contact.objects.create(owner=target, contact=viewer)
    api.touch(target)
    html = render(
        "{% presence_prefetch ids %}{% presence_dot big %}|{% last_seen big %}|"
        "{% member_card big as card %}{{ card }}|{% presence_dot target %}",
        request_for(viewer),
        big=big,
        ids=[big, target.pk],
        target=target,
    )
    assert html == f"||None|{dot_html(target.pk, 'online')}"


def test_dot_of_an_unknown_user_is_offline(make_user: Callable[..., Any]) -> None:
    html = render("{% presence_dot 987654321 %}", request_for(make_user()))
    assert html == dot_html(987654321, "offline")


def test_tags_without_a_request_see_as_anonymous(make_user: Callable[..., Any]) -> None:
    public, private = make_user(), make_user()
    PrivacySettings.objects.create(user=public, online_visibility="everyone")
    api.touch(public)
    api.touch(private)
    html = render(
        "{% presence_dot a %}{% last_seen a %}|{% presence_dot b %}{% last_seen b %}|"
        "{% online_friends as f %}{{ f|length }}",
        a=public,
        b=private,
    )
    # The private user's last seen is hidden, and its day too: seen today only (the approximate
    # last seen counts from the days before today).
    private_html = f"{dot_html(private.pk, 'offline')}"
    assert html == f"{dot_html(public.pk, 'online')}online|{private_html}|0"


# --- last_seen ------------------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_last_seen_texts(language: str, make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    online, just_now, minutes, hours, days, hidden = (make_user() for _ in range(6))
    for target in (online, just_now, minutes, hours, days):
        Contact.objects.create(owner=target, contact=viewer)
    PrivacySettings.objects.create(
        user=hidden, online_visibility="everyone", last_seen_visibility="nobody"
    )

    def active(user: Any, ago: timedelta, logout: bool = False) -> None:
        with time_machine.travel(NOW - ago, tick=False):
            api.touch(user)
            if logout:  # offline at once (after OFFLINE_GRACE), not after ONLINE_WINDOW
                api.sign_off(user)

    active(online, timedelta(seconds=20))
    active(just_now, timedelta(seconds=30), logout=True)
    active(minutes, timedelta(minutes=5, seconds=10), logout=True)
    active(hours, timedelta(hours=2, minutes=59))
    LastSeen.objects.create(user=days, seen_at=NOW - timedelta(days=3, hours=5))
    active(hidden, timedelta(days=1, hours=1))  # a day before today: its bucket's base
    active(hidden, timedelta(hours=1))

    with time_machine.travel(NOW, tick=False), translation.override(language):
        html = render(
            "{% for u in users %}{% last_seen u %}|{% endfor %}",
            request_for(viewer),
            users=[online, just_now, minutes, hours, days, hidden],
        )
    assert html.split("|") == [*LAST_SEEN[language], RECENTLY[language], ""]


def test_last_seen_is_empty_for_a_stranger_and_escaped(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    viewer, target = make_user(), make_user()
    with time_machine.travel(T0 - timedelta(days=1), tick=False):
        api.touch(target)  # a day before today: the approximate last seen counts from it
    with time_machine.travel(T0, tick=False):
        api.touch(target)
        seen = render("[{% last_seen t %}]", request_for(viewer), t=target)
        assert seen == "[last seen recently]"
        settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "APPROXIMATE_LAST_SEEN": False}
        assert render("[{% last_seen t %}]", request_for(viewer), t=target) == "[]"
        assert render("[{% last_seen t %}]", request_for(target), t=target) == "[online]"


# --- presence_text --------------------------------------------------------------------------


def text_html(pk: Any, text: str = "") -> str:
    return f'<span class="presence-text" data-presence-text="{pk}">{text}</span>'


def test_presence_text_markup_escaped(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    both, text_only, emoji_only, markup, none = (make_user() for _ in range(5))
    for target in (both, text_only, emoji_only, markup, none):
        Contact.objects.create(owner=target, contact=viewer)
    api.set_status(both, "auto", text="Focus", emoji="🎧")
    api.set_status(text_only, "dnd", text="Lunch")
    api.set_status(emoji_only, "auto", emoji="🌴")
    api.set_status(markup, "auto", text='<b>"Tom & Jerry"</b>', emoji="'")
    html = render(
        "{% for u in users %}{% presence_text u %}|{% endfor %}",
        request_for(viewer),
        users=[both, text_only, emoji_only, markup, none],
    )
    assert html.split("|") == [
        text_html(both.pk, "🎧 Focus"),
        text_html(text_only.pk, "Lunch"),
        text_html(emoji_only.pk, "🌴"),
        text_html(markup.pk, "&#x27; &lt;b&gt;&quot;Tom &amp; Jerry&quot;&lt;/b&gt;"),
        text_html(none.pk),  # nothing to show: empty, for presence.js to fill later
        "",
    ]


def test_presence_text_is_empty_where_the_viewer_may_not_see_it(
    make_user: Callable[..., Any],
) -> None:
    viewer = make_user()
    contact, hidden, blocked, blocking, stranger, expired = (make_user() for _ in range(6))
    for target in (contact, hidden, blocked, blocking, expired):
        Contact.objects.create(owner=target, contact=viewer)
    PrivacySettings.objects.create(user=hidden, activity_visibility="nobody")
    Block.objects.create(blocker=viewer, blocked=blocked)
    Block.objects.create(blocker=blocking, blocked=viewer)
    with time_machine.travel(NOW - timedelta(hours=2), tick=False):
        for target in (contact, hidden, blocked, blocking, stranger):
            api.set_status(target, "auto", text="Away", emoji="🌴")
        api.set_status(
            expired, "auto", text="Away", emoji="🌴", expires_at=NOW - timedelta(hours=1)
        )
    users = [contact, hidden, blocked, blocking, stranger, expired]
    source = "{% for u in users %}{% presence_text u %}|{% endfor %}"
    with time_machine.travel(NOW, tick=False):
        html = render(source, request_for(viewer), users=users)
        # Each sees their own, an expired one excepted.
        own = [render("{% presence_text u %}", request_for(user), u=user) for user in users]
    assert html.split("|") == [
        text_html(contact.pk, "🌴 Away"),
        text_html(hidden.pk),
        text_html(blocked.pk),
        text_html(blocking.pk),
        text_html(stranger.pk),  # contacts only, by default
        text_html(expired.pk),
        "",
    ]
    assert own == [text_html(user.pk, "🌴 Away") for user in users[:-1]] + [text_html(expired.pk)]


def test_presence_text_of_what_names_no_user_and_without_a_request(
    make_user: Callable[..., Any],
) -> None:
    public, private = make_user(), make_user()
    PrivacySettings.objects.create(user=public, activity_visibility="everyone")
    api.set_status(public, "auto", text="Hi")
    api.set_status(private, "auto", text="Hi")
    html = render(
        "{% presence_text none %}|{% presence_text junk %}|{% presence_text a %}|"
        "{% presence_text b %}|{% presence_text pk %}",
        none=None,
        junk="x",
        a=public,
        b=private,
        pk=str(public.pk),
    )
    # Without a request, as a stranger sees it.
    assert html.split("|") == [
        "",
        "",
        text_html(public.pk, "Hi"),
        text_html(private.pk),
        text_html(public.pk, "Hi"),
    ]


def test_presence_text_as_a_variable_is_the_text_alone(make_user: Callable[..., Any]) -> None:
    viewer, friend, hidden = make_user(), make_user(), make_user()
    Contact.objects.create(owner=friend, contact=viewer)
    api.set_status(friend, "auto", text="<Focus>", emoji="🎧")
    api.set_status(hidden, "auto", text="Secret")
    html = render(
        "{% presence_text f as s %}[{{ s }}]{% presence_text h as t %}[{{ t }}]"
        "{% presence_text f as u %}{% if u %}yes{% endif %}",
        request_for(viewer),
        f=friend,
        h=hidden,
    )
    assert html == "[🎧 &lt;Focus&gt;][]yes"


@pytest.mark.parametrize(
    "source", ["{% presence_text %}", "{% presence_text a b %}", "{% presence_text a to b %}"]
)
def test_presence_text_syntax(source: str) -> None:
    with pytest.raises(TemplateSyntaxError, match="presence_text user as name"):
        Template("{% load presence %}" + source)


def test_presence_text_carries_the_pages_stamp(make_user: Callable[..., Any]) -> None:
    # As the dots do: the socket is then sent the custom statuses changed since (websocket.md).
    viewer, friend = make_user(), make_user()
    Contact.objects.create(owner=friend, contact=viewer)
    api.set_status(friend, "auto", text="Focus")
    request = request_for(viewer)
    html = Template("{% load presence %}{% presence_dot f %}{% presence_text f %}").render(
        Context({"request": request, "f": friend})
    )
    stamp = stamps.page_stamp(request)
    assert stamp is not None
    assert html.endswith(
        f'<span class="presence-text" data-presence-text="{friend.pk}" '
        f'data-presence-since="{stamp}">Focus</span>'
    )
    assert html.count(f'data-presence-since="{stamp}"') == 2


def test_presence_text_after_prefetch_costs_nothing_more(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    users = _page(make_user, viewer)
    for user in users[::2]:
        api.set_status(user, "auto", text=f"Hello {user.pk}", emoji="👋")
    request = request_for(viewer)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        render("{% presence_prefetch users %}", request, users=users)
    assert (len(queries), trips.count) == (1, 1)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render(
            "{% for u in users %}{% presence_dot u %}{% presence_text u %}\n{% endfor %}",
            request,
            users=users,
        )
    assert (len(queries), trips.count) == (0, 0)
    lines = html.strip("\n").split("\n")
    assert lines == [
        dot_html(u.pk, "online" if i % 2 == 0 else "offline")
        + text_html(u.pk, f"👋 Hello {u.pk}" if i % 2 == 0 else "")
        for i, u in enumerate(users)
    ]


# --- online_friends -------------------------------------------------------------------------


def _friends(user: Any, *others: Any) -> None:
    for other in others:
        Contact.objects.create(owner=user, contact=other)
        Contact.objects.create(owner=other, contact=user)


def test_online_friends_tag_with_and_without_limit(make_user: Callable[..., Any]) -> None:
    user = make_user()
    first, second, offline, hidden = (make_user(username=n) for n in ("ann", "bo", "cy", "di"))
    _friends(user, first, second, offline, hidden)
    PrivacySettings.objects.create(user=hidden, online_visibility="nobody")
    with time_machine.travel(NOW - timedelta(minutes=2), tick=False):
        api.touch(second)
        api.touch(hidden)
    with time_machine.travel(NOW - timedelta(minutes=1), tick=False):
        api.touch(first)
    source = (
        "{% online_friends as all %}{% online_friends limit=1 as one %}"
        "{% for f in all %}{{ f.username }} {% presence_dot f %};{% endfor %}|"
        "{% for f in one %}{{ f.username }}{% endfor %}"
    )
    with time_machine.travel(NOW, tick=False):
        html = render(source, request_for(user))
        anonymous = render(source, request_for(None))
    assert html == (f"ann {dot_html(first.pk, 'online')};bo {dot_html(second.pk, 'online')};|ann")
    assert anonymous == "|"


def test_online_friends_tag_then_dots_cost_nothing_more(make_user: Callable[..., Any]) -> None:
    user = make_user()
    friends = [make_user() for _ in range(20)]
    _friends(user, *friends)
    for friend in friends:
        api.touch(friend)
    # Warm: the connection, and the read's script on every master (a first use loads it).
    get_store().client.script_load(READ_RECENT.source)
    request = request_for(user)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        render("{% online_friends as fs %}", request)
    tag_queries, tag_trips = len(queries), trips.count
    # online_friends itself (friends, then privacy facts and users) fills the dots' cache too.
    assert (tag_queries, tag_trips) == (2, 1)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render(
            "{% for f in fs %}{% presence_dot f %}{% last_seen f %}{% endfor %}",
            request,
            fs=friends,
        )
    assert (len(queries), trips.count) == (0, 0)
    assert html.count("presence-dot--online") == 20


# --- presence_prefetch: a page of 50 ----------------------------------------------------------


def _page(make_user: Callable[..., Any], viewer: Any) -> list[Any]:
    users = [make_user() for _ in range(50)]
    for user in users[::2]:
        Contact.objects.create(owner=user, contact=viewer)
        api.touch(user)
    get_store().client.ping()  # connect before counting
    return users


PAGE = "{% for u in users %}{% presence_dot u %} {% last_seen u %}\n{% endfor %}"


def test_prefetch_makes_a_page_of_50_dots_cost_one_query_and_one_round_trip(
    make_user: Callable[..., Any],
) -> None:
    viewer = make_user()
    users = _page(make_user, viewer)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render("{% presence_prefetch users %}" + PAGE, request_for(viewer), users=users)
    assert len(queries) == 1
    assert trips.count == 1
    lines = html.strip("\n").split("\n")
    assert lines == [
        f"{dot_html(u.pk, 'online' if i % 2 == 0 else 'offline')} "
        + ("online" if i % 2 == 0 else "")
        for i, u in enumerate(users)
    ]


def test_without_prefetch_each_user_costs_one_read(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    users = _page(make_user, viewer)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        with_prefetch = render(
            "{% presence_prefetch users %}" + PAGE, request_for(viewer), users=users
        )
    assert (len(queries), trips.count) == (1, 1)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        without = render(PAGE, request_for(viewer), users=users)
    # The same page; last_seen after presence_dot reuses the request's cache.
    assert without == with_prefetch
    assert (len(queries), trips.count) == (50, 50)


def test_prefetch_of_a_queryset(make_user: Callable[..., Any]) -> None:
    from django.contrib.auth import get_user_model

    viewer = make_user()
    _page(make_user, viewer)
    users = get_user_model().objects.exclude(pk=viewer.pk).order_by("pk")
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render("{% presence_prefetch users %}" + PAGE, request_for(viewer), users=users)
    assert len(queries) == 2  # the users themselves, then their presence
    assert trips.count == 1
    assert html.count("presence-dot--online") == 25


# --- presence_script ------------------------------------------------------------------------


def quoted(json_text: str) -> str:
    return json_text.replace('"', "&quot;")


#: the words of "5 minutes ago" and how the count is written, in English (presence.js writes
#: them as the server does: a unit's words for most numbers, then those that differ)
WORDS_EN = (
    '"ago":"%(delta)s ago","units":{"year":["%(num)d years",{"1":"%(num)d year"}],'
    '"month":["%(num)d months",{"1":"%(num)d month"}],'
    '"week":["%(num)d weeks",{"1":"%(num)d week"}],"day":["%(num)d days",{"1":"%(num)d day"}],'
    '"hour":["%(num)d hours",{"1":"%(num)d hour"}],'
    '"minute":["%(num)d minutes",{"1":"%(num)d minute"}]},'
    '"numberGrouping":3,"thousandSeparator":","'
)


@pytest.mark.parametrize(
    ("language", "labels"),
    [
        (
            "en",
            "{&quot;online&quot;:&quot;Online&quot;,&quot;idle&quot;:&quot;Idle&quot;,"
            "&quot;dnd&quot;:&quot;Do not disturb&quot;,&quot;offline&quot;:&quot;Offline&quot;,"
            "&quot;onlineText&quot;:&quot;online&quot;,&quot;justNow&quot;:&quot;just now&quot;,"
            "&quot;recently&quot;:&quot;last seen recently&quot;,"
            "&quot;within_week&quot;:&quot;last seen within a week&quot;,"
            "&quot;within_month&quot;:&quot;last seen within a month&quot;,"
            "&quot;long_ago&quot;:&quot;last seen a long time ago&quot;," + quoted(WORDS_EN) + "}",
        ),
        (
            "ja",
            "{&quot;online&quot;:&quot;オンライン&quot;,&quot;idle&quot;:&quot;退席中&quot;,"
            "&quot;dnd&quot;:&quot;取り込み中&quot;,&quot;offline&quot;:&quot;オフライン&quot;,"
            "&quot;onlineText&quot;:&quot;オンライン&quot;,&quot;justNow&quot;:&quot;たった今&quot;,"
            "&quot;recently&quot;:&quot;最近オンライン&quot;,"
            "&quot;within_week&quot;:&quot;1週間以内にオンライン&quot;,"
            "&quot;within_month&quot;:&quot;1か月以内にオンライン&quot;,"
            "&quot;long_ago&quot;:&quot;長期間オフライン&quot;,"
            + quoted(
                '"ago":"%(delta)s前","units":{"year":["%(num)d年",{}],'
                '"month":["%(num)dか月",{}],"week":["%(num)d週間",{}],"day":["%(num)d日",{}],'
                '"hour":["%(num)d時間",{}],"minute":["%(num)d分",{}]},'
                '"numberGrouping":3,"thousandSeparator":","'
            )
            + "}",
        ),
    ],
)
def test_presence_script_markup(language: str, labels: str) -> None:
    with translation.override(language):
        html = render("{% presence_script %}")
    assert html == (
        '<script src="/static/presence/presence.js" '
        'data-presence-endpoint="/presence/api/presence" '
        'data-presence-status-endpoint="/presence/api/status" '
        'data-presence-socket="/ws/presence/" '
        'data-presence-heartbeat="30" data-presence-idle-after="300" '
        f'data-presence-labels="{labels}" defer></script>'
    )


SCRIPT_LABELS = (
    "{&quot;online&quot;:&quot;Online&quot;,&quot;idle&quot;:&quot;Idle&quot;,"
    "&quot;dnd&quot;:&quot;Do not disturb&quot;,&quot;offline&quot;:&quot;Offline&quot;,"
    "&quot;onlineText&quot;:&quot;online&quot;,&quot;justNow&quot;:&quot;just now&quot;,"
    "&quot;recently&quot;:&quot;last seen recently&quot;,"
    "&quot;within_week&quot;:&quot;last seen within a week&quot;,"
    "&quot;within_month&quot;:&quot;last seen within a month&quot;,"
    "&quot;long_ago&quot;:&quot;last seen a long time ago&quot;," + quoted(WORDS_EN) + "}"
)


def test_presence_script_reads_the_timings_from_settings() -> None:
    with override_settings(PRESENCE={"HEARTBEAT_INTERVAL": 5, "IDLE_AFTER": 60}):
        html = render("{% presence_script %}")
    assert html == (
        '<script src="/static/presence/presence.js" '
        'data-presence-endpoint="/presence/api/presence" '
        'data-presence-status-endpoint="/presence/api/status" '
        'data-presence-socket="/ws/presence/" '
        'data-presence-heartbeat="5" data-presence-idle-after="60" '
        f'data-presence-labels="{SCRIPT_LABELS}" defer></script>'
    )


def test_presence_script_with_another_socket_path_or_none() -> None:
    html = render('{% presence_script socket="/live/presence/?device=desktop" %}')
    assert html == (
        '<script src="/static/presence/presence.js" '
        'data-presence-endpoint="/presence/api/presence" '
        'data-presence-status-endpoint="/presence/api/status" '
        'data-presence-socket="/live/presence/?device=desktop" '
        'data-presence-heartbeat="30" data-presence-idle-after="300" '
        f'data-presence-labels="{SCRIPT_LABELS}" defer></script>'
    )
    # No socket: the client polls the JSON endpoint (a site served without ASGI).
    assert render('{% presence_script socket="" %}') == (
        '<script src="/static/presence/presence.js" '
        'data-presence-endpoint="/presence/api/presence" '
        'data-presence-status-endpoint="/presence/api/status" '
        'data-presence-heartbeat="30" data-presence-idle-after="300" '
        f'data-presence-labels="{SCRIPT_LABELS}" defer></script>'
    )


def test_presence_script_under_a_script_prefix() -> None:
    from django.urls import set_script_prefix

    set_script_prefix("/site/")
    try:
        html = render("{% presence_script %}")
    finally:
        set_script_prefix("/")
    assert 'data-presence-endpoint="/site/presence/api/presence"' in html
    assert 'data-presence-socket="/site/ws/presence/"' in html


def test_tags_during_a_redis_outage(make_user: Callable[..., Any]) -> None:
    viewer, friend = make_user(), make_user()
    _friends(viewer, friend)
    LastSeen.objects.create(user=friend, seen_at=NOW - timedelta(hours=5))
    api.touch(friend)  # online in the real Redis, which is out of reach below
    down = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    with override_settings(CACHES=down), time_machine.travel(NOW, tick=False):
        html = render(
            "{% presence_dot f %}|{% last_seen f %}|{% online_friends as fs %}{{ fs|length }}",
            request_for(viewer),
            f=friend,
        )
    assert html == f"{dot_html(friend.pk, 'offline')}|5{NBSP}hours ago|0"


# --- the stylesheet, and tags rendered without a viewer -------------------------------------


def test_presence_css_markup() -> None:
    assert render("{% presence_css %}") == (
        '<link rel="stylesheet" href="/static/presence/presence.css">'
    )


def test_a_tag_without_request_says_so_once_in_debug(
    make_user: Callable[..., Any], caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    from presence import rendering

    target = make_user("target")
    monkeypatch.setattr(rendering, "_warned_without_request", False)
    with caplog.at_level("WARNING", logger="presence"):
        with override_settings(DEBUG=False):
            render("{% presence_dot target %}", target=target)
        assert caplog.records == []  # not outside DEBUG
        with override_settings(DEBUG=True):
            render("{% presence_dot target %}", target=target)
            render("{% last_seen target %}{% presence_dot target %}", target=target)
    [record] = caplog.records
    assert "without `request`" in record.getMessage()
    assert "presence.W004" in record.getMessage()


def test_a_tag_with_request_says_nothing(
    make_user: Callable[..., Any], caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    from presence import rendering

    viewer, target = make_user("viewer"), make_user("target")
    monkeypatch.setattr(rendering, "_warned_without_request", False)
    request = RequestFactory().get("/")
    request.user = viewer
    with caplog.at_level("WARNING", logger="presence"), override_settings(DEBUG=True):
        render("{% presence_dot target %}", request, target=target)
    assert caplog.records == []


# --- Content Security Policy nonces ---------------------------------------------------------


def test_presence_script_carries_the_csp_nonce_of_django_csp() -> None:
    request = RequestFactory().get("/")
    request.csp_nonce = "r4nd0m"  # type: ignore[attr-defined]  # what django-csp sets
    html = render('{% presence_script socket="" %}', request)
    assert html.endswith(' defer nonce="r4nd0m"></script>')


def test_presence_script_carries_djangos_own_csp_nonce() -> None:
    # Django's csp context processor puts csp_nonce in the context.
    html = render('{% presence_script socket="" %}', csp_nonce="fr0m-django")
    assert html.endswith(' defer nonce="fr0m-django"></script>')


def test_presence_script_without_a_nonce_has_no_nonce_attribute() -> None:
    assert "nonce" not in render('{% presence_script socket="" %}', RequestFactory().get("/"))


# --- the live online-friends list -----------------------------------------------------------


def test_online_friends_list_markup(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from tests.clock import T0

    ann, ben, cy, dee = make_user("ann"), make_user("ben"), make_user("cy"), make_user("dee")
    for friend in (ben, cy):  # friends: mutual contacts; dee only follows ann
        Contact.objects.create(owner=ann, contact=friend)
        Contact.objects.create(owner=friend, contact=ann)
    Contact.objects.create(owner=dee, contact=ann)
    LastSeen.objects.create(user=cy, seen_at=T0 - timedelta(hours=1))
    api.touch(ben)
    api.touch(dee)
    request = RequestFactory().get("/")
    request.user = ann
    html = render("{% online_friends_list limit=5 %}", request)
    ben_dot = render("{% presence_dot ben %}", request, ben=ben)
    cy_dot = render("{% presence_dot cy %}", request, cy=cy)
    assert html == (
        '<div class="presence-friends" data-presence-friends data-presence-friends-limit="5">\n'
        '  <ul class="presence-friends__list">\n'
        f'    <li data-presence-friend="{ben.pk}" data-presence-last-seen-at="'
        f'{T0.isoformat()}">{ben_dot} ben</li>\n'
        f'    <li data-presence-friend="{cy.pk}" data-presence-last-seen-at="'
        f'{(T0 - timedelta(hours=1)).isoformat()}" hidden>{cy_dot} cy</li>\n'
        "  </ul>\n"
        '  <p class="presence-friends__empty" data-presence-friends-empty hidden>'
        "No friend is online right now.</p>\n"
        "</div>\n"
    )


def test_online_friends_list_shows_at_most_limit_and_nothing_to_strangers(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ann = make_user("ann")
    friends = [make_user(f"f{n}") for n in range(4)]
    for friend in friends:
        Contact.objects.create(owner=ann, contact=friend)
        Contact.objects.create(owner=friend, contact=ann)
        api.touch(friend)
    request = RequestFactory().get("/")
    request.user = ann
    html = render("{% online_friends_list limit=2 %}", request)
    assert html.count("<li ") == 4 and html.count('" hidden>') == 2  # two shown, two hidden
    request.user = AnonymousUser()
    assert "<li " not in render("{% online_friends_list %}", request)


@pytest.mark.parametrize("tag", ["online_friends", "online_friends_list"])
@pytest.mark.parametrize("limit", ['"5"', "-1", "True"])
def test_both_friends_tags_refuse_a_limit_that_is_not_a_count(
    tag: str, limit: str, make_user: Callable[..., Any]
) -> None:
    request = RequestFactory().get("/")
    request.user = make_user("ann")
    with pytest.raises(ValueError, match="limit must be a non-negative int"):
        render(f"{{% {tag} limit={limit} %}}", request)


def _friends(viewer: Any, *friends: Any) -> None:
    for friend in friends:
        Contact.objects.create(owner=viewer, contact=friend)
        Contact.objects.create(owner=friend, contact=viewer)


@pytest.mark.parametrize(
    "hidden_setting",
    [{"invisible": True}, {"online_visibility": "nobody"}, {"last_seen_visibility": "nobody"}],
)
def test_online_friends_list_orders_hidden_friends_whatever_their_true_last_seen(
    hidden_setting: dict[str, Any],
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
) -> None:
    """The hidden items of the live list are in an order only what the viewer may see decides:
    friends whose last seen the viewer sees, most recent first, then the others by id. A
    hidden friend seen a minute ago and one seen three days ago sit in the same place."""

    ann = make_user("ann")
    first, hidden, last, shown = (make_user(name) for name in ("first", "hidden", "last", "shown"))
    _friends(ann, first, hidden, last, shown)
    PrivacySettings.objects.create(user=hidden, **hidden_setting)
    for friend in (first, last):  # hidden too, seen a day ago
        PrivacySettings.objects.create(user=friend, last_seen_visibility="nobody")
        LastSeen.objects.create(user=friend, seen_at=T0 - timedelta(days=1))
    LastSeen.objects.create(user=shown, seen_at=T0 - timedelta(days=5))
    seen = LastSeen.objects.create(user=hidden, seen_at=T0 - timedelta(minutes=1))

    def page() -> str:
        return render("{% online_friends_list limit=5 %}", request_for(ann))

    recently = page()
    seen.seen_at = T0 - timedelta(days=3)
    seen.save()
    assert page() == recently
    # The friend whose last seen ann sees first, then the hidden ones by id.
    items = [
        f'    <li data-presence-friend="{shown.pk}" data-presence-last-seen-at="'
        f'{(T0 - timedelta(days=5)).isoformat()}" hidden>{dot_html(shown.pk, "offline")} shown</li>'
    ] + [
        f'    <li data-presence-friend="{friend.pk}" data-presence-last-seen-at="" hidden>'
        f"{dot_html(friend.pk, 'offline')} {friend.username}</li>"
        for friend in sorted((first, hidden, last), key=lambda user: user.pk)
    ]
    assert recently == (
        '<div class="presence-friends" data-presence-friends data-presence-friends-limit="5">\n'
        '  <ul class="presence-friends__list">\n' + "\n".join(items) + "\n  </ul>\n"
        '  <p class="presence-friends__empty" data-presence-friends-empty>'
        "No friend is online right now.</p>\n"
        "</div>\n"
    )


def test_online_friends_leave_out_friends_blocked_either_way(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """A friend who blocked the viewer, or whom the viewer blocked, is no friend to show: not
    in the live list (not even hidden and watched), nor in online_friends."""
    ann = make_user("ann")
    blocker, blocked, friend = make_user("blocker"), make_user("blocked"), make_user("friend")
    _friends(ann, blocker, blocked, friend)
    Block.objects.create(blocker=blocker, blocked=ann)
    Block.objects.create(blocker=ann, blocked=blocked)
    for user in (blocker, blocked, friend):
        LastSeen.objects.create(user=user, seen_at=T0 - timedelta(hours=1))
    html = render("{% online_friends_list %}", request_for(ann))
    assert re.findall(r'data-presence-friend="([^"]+)"', html) == [str(friend.pk)]
    assert relations.friend_ids(ann) == [friend.pk]
    for user in (blocker, blocked, friend):
        api.touch(user)
    assert api.online_friends(ann) == [friend]
    html = render("{% online_friends_list %}", request_for(ann))
    assert re.findall(r'data-presence-friend="([^"]+)"', html) == [str(friend.pk)]


@pytest.mark.parametrize("count", [3, 60])
def test_online_friends_list_costs_the_same_whatever_the_number_of_friends(
    count: int, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ann = make_user("ann")
    friends = [make_user() for _ in range(count)]
    _friends(ann, *friends)
    for index, friend in enumerate(friends):
        if index % 3 == 0:
            api.touch(friend)
        elif index % 3 == 1:
            PrivacySettings.objects.create(user=friend, last_seen_visibility="nobody")
            LastSeen.objects.create(user=friend, seen_at=T0 - timedelta(days=index))
    get_store().client.script_load(READ_RECENT.source)
    request = request_for(ann)
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render("{% online_friends_list limit=5 %}", request)
    # friend ids, the online ones' facts and rows, the others' facts and rows; the dots cost
    # nothing more (they show the presence that placed them)
    assert len(queries) == 3
    assert trips.count == 2  # the online ones, the others
    assert html.count("<li ") == count
