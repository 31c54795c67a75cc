"""presence.js's room pages (``presence.room(name).more()``) against scripted frames and HTTP
answers (test_client_rules.py's stand-in socket and fetch, the page's clock moved by the test):
what reads the room's first page again keeps the pages read since. A join again (a change of
meta: the typing recipe of rooms.md) and a poll update the room's list in place; only a fresh
room_state (a reconnect, an outage) starts it again from the first page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.browser.test_client_rules import Client, member, room_state
from tests.browser.test_client_rules import chromium_browser as chromium_browser
from tests.browser.test_client_rules import client as client

ROOM_ENDPOINT = "/presence/api/rooms/doc:7"
ROOM = (
    f"<div data-presence-room='doc:7' data-presence-room-endpoint='{ROOM_ENDPOINT}'>"
    "<ul data-presence-room-members></ul>"
    "<span data-presence-room-others hidden>+0</span>"
    "<span data-presence-room-count>0</span></div>"
)
POLL_MS = 15_000


def shown(c: Client) -> list[str]:
    """The members the room's element lists, in order."""
    result: list[str] = c.js(
        "() => Array.from(document.querySelectorAll('[data-presence-room-member]'))"
        ".map((li) => li.getAttribute('data-presence-room-member'))"
    )
    return result


def others_shown(c: Client) -> str:
    result: str = c.js("() => document.querySelector('[data-presence-room-others]').textContent")
    return result


def view(c: Client) -> dict[str, Any]:
    result: dict[str, Any] = c.js(
        "() => { const r = presence.room('doc:7');"
        " return {members: Object.keys(r.members), others: r.others, count: r.count,"
        " next: r.next}; }"
    )
    return result


def room_page(members: dict[str, Any], cursor: str | None, count: int = 3) -> dict[str, Any]:
    return {
        "type": "room_page",
        "room": "doc:7",
        "members": members,
        "others": 0,
        "count": count,
        "next": cursor,
    }


def first_read(cursor: str | None = "c1", count: int = 3) -> dict[str, Any]:
    """The endpoint's first page: Ann listed, the others counted."""
    return {"members": {"1": member("Ann")}, "others": count - 1, "count": count, "next": cursor}


def paged_over_the_socket(c: Client) -> None:
    """Joined (Ann listed, 2 others), then Bob's page read: Ann, Bob; Cy's cursor next."""
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.receive(room_page({"2": member("Bob")}, "c2"))
    assert shown(c) == ["1", "2"]


# --- a join again (a new meta) --------------------------------------------------------------------


def test_a_join_again_keeps_the_pages_read(client: Callable[..., Client]) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    assert c.sent("join")[-1] == {"type": "join", "room": "doc:7", "meta": {"typing": True}}
    c.receive(room_state("c1"))  # its answer: the connection's first page, brought up to date
    assert shown(c) == ["1", "2"]
    assert view(c) == {"members": ["1", "2"], "others": 1, "count": 3, "next": "c2"}
    assert others_shown(c) == "+1"
    # The next page follows the pages read, not the first page again.
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.sent("room_more")[-1]["after"] == "c2"


def test_a_page_asked_before_a_join_again_is_answered_still_merges(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    c.receive(room_page({"2": member("Bob"), "3": member("Cy")}, None))
    c.receive(room_state("c1"))
    assert c.js("() => window.__page") == {"2": member("Bob"), "3": member("Cy")}
    assert shown(c) == ["1", "2", "3"]
    # The page answered after the join again's state (the server took the join first).
    c.js("() => presence.joinRoom('doc:7', {typing: false})")
    c.receive({**room_state("c1"), "count": 4, "others": 3})  # one more arrived meanwhile
    # The pages had reached the end: the newcomer is on a page after the state's, asked anew.
    assert view(c) == {"members": ["1", "2", "3"], "others": 1, "count": 4, "next": "c1"}


def test_a_join_again_lists_the_first_page_as_its_state_does(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    # Ann left meanwhile, Bob (paged) is now on the first page, with Dan who arrived.
    c.receive(
        {
            "type": "room_state",
            "room": "doc:7",
            "members": {"2": member("Bob"), "4": member("Dan")},
            "others": 1,
            "count": 3,
            "next": "c9",
        }
    )
    assert shown(c) == ["2", "4"]  # a first-page member not in it left (or was pushed off)
    # Paged again from the state's cursor: one pushed to a later page is listed again.
    assert view(c) == {"members": ["2", "4"], "others": 1, "count": 3, "next": "c9"}


def test_a_paged_member_the_state_does_not_list_stays_and_others_stay_consistent(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    # Ann and Cy left: the state counts Ann alone. Bob's leaving (paged) is never sent.
    c.receive({**room_state("c1"), "others": 0, "count": 1})
    assert shown(c) == ["1", "2"]  # as the poll would: nothing said Bob left
    assert view(c)["others"] == 0  # never below 0
    assert others_shown(c) == "+0"


def test_a_join_again_listing_the_whole_room_drops_the_paged_members_it_does_not_list(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    # Its "next" is null: the state lists every member the viewer may see, so Bob left.
    c.receive({**room_state(None), "others": 0, "count": 1})
    assert shown(c) == ["1"]
    assert view(c) == {"members": ["1"], "others": 0, "count": 1, "next": None}


def test_a_join_again_after_the_pages_reached_the_end_pages_on_to_newcomers(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.receive(room_page({"2": member("Bob"), "3": member("Cy")}, None))
    # Two newcomers, counted: the connection's list is full.
    c.receive(
        {"type": "room_diff", "room": "doc:7", "joins": {}, "leaves": [], "others": 4, "count": 5}
    )
    c.js("() => presence.joinRoom('doc:7', {typing: true})")
    c.receive({**room_state("c1"), "others": 4, "count": 5})
    assert view(c) == {"members": ["1", "2", "3"], "others": 2, "count": 5, "next": "c1"}
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.sent("room_more")[-1] == {"type": "room_more", "room": "doc:7", "after": "c1"}
    # The pages read again list Bob and Cy (kept once), then the newcomers.
    c.receive(room_page({"2": member("Bob"), "3": member("Cy")}, "c3", count=5))
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.sent("room_more")[-1]["after"] == "c3"
    c.receive(room_page({"4": member("Dan"), "5": member("Eve")}, None, count=5))
    assert shown(c) == ["1", "2", "3", "4", "5"]
    assert view(c)["others"] == 0


def test_a_fresh_state_after_a_reconnect_starts_from_the_first_page(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.close_socket(1006)
    c.tick(1_000)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    assert shown(c) == ["1"]
    assert view(c)["next"] == "c1"


def test_an_unprompted_state_starts_from_the_first_page(client: Callable[..., Client]) -> None:
    c = client(ROOM)
    paged_over_the_socket(c)
    c.receive(room_state("c1"))  # after an outage: the hub's fresh state, answering no join
    assert shown(c) == ["1"]
    assert view(c)["next"] == "c1"


# --- polling --------------------------------------------------------------------------------------


def paged_while_polling(c: Client) -> None:
    assert c.js("() => presence.state") == "polling"
    c.tick(POLL_MS)
    c.answer(ROOM_ENDPOINT, first_read())
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.fetches(ROOM_ENDPOINT)[-1] == f"{ROOM_ENDPOINT}?after=c1"
    c.answer(ROOM_ENDPOINT, {**first_read("c2"), "members": {"2": member("Bob")}})
    assert shown(c) == ["1", "2"]


def test_a_poll_keeps_the_pages_read(client: Callable[..., Client]) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    paged_while_polling(c)
    c.tick(POLL_MS)  # the next poll reads the first page again
    c.answer(ROOM_ENDPOINT, first_read())
    assert shown(c) == ["1", "2"]
    assert view(c) == {"members": ["1", "2"], "others": 1, "count": 3, "next": "c2"}
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.fetches(ROOM_ENDPOINT)[-1] == f"{ROOM_ENDPOINT}?after=c2"


def test_a_page_read_while_a_poll_is_answered_still_merges(client: Callable[..., Client]) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    c.tick(POLL_MS)
    c.answer(ROOM_ENDPOINT, first_read())
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.tick(POLL_MS)  # a poll while the page is read
    c.answer(ROOM_ENDPOINT, first_read(), nth=1)  # the poll's answer first
    c.answer(ROOM_ENDPOINT, {**first_read(None), "members": {"2": member("Bob")}})
    assert c.js("() => window.__page") == {"2": member("Bob")}
    assert shown(c) == ["1", "2"]


def test_a_poll_lists_the_first_page_as_the_endpoint_does(client: Callable[..., Client]) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    paged_while_polling(c)
    c.tick(POLL_MS)
    # Ann left, Dan arrived and is listed first; Bob (paged) is not on the first page.
    c.answer(ROOM_ENDPOINT, {**first_read(), "members": {"4": member("Dan")}, "others": 2})
    assert shown(c) == ["4", "2"]
    assert view(c)["others"] == 1


def polled_to_the_end(c: Client) -> None:
    """Polling: Ann on the first page, Bob and Cy paged, to the end of the room."""
    c.tick(POLL_MS)
    c.answer(ROOM_ENDPOINT, first_read("c1"))
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.answer(
        ROOM_ENDPOINT,
        {"members": {"2": member("Bob"), "3": member("Cy")}, "others": 0, "count": 3, "next": None},
    )
    assert view(c) == {"members": ["1", "2", "3"], "others": 0, "count": 3, "next": None}


def test_a_poll_listing_the_whole_room_drops_the_paged_members_it_does_not_list(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    polled_to_the_end(c)
    c.tick(POLL_MS)
    # Bob and Cy left: the first page, with "next": null, is every member the viewer may see.
    c.answer(ROOM_ENDPOINT, {**first_read(None, count=1)})
    assert shown(c) == ["1"]
    assert view(c) == {"members": ["1"], "others": 0, "count": 1, "next": None}


def test_a_poll_after_the_pages_reached_the_end_pages_on_to_newcomers(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    polled_to_the_end(c)
    c.tick(POLL_MS)
    c.answer(ROOM_ENDPOINT, first_read("c1", count=5))  # two newcomers, after Cy
    assert view(c) == {"members": ["1", "2", "3"], "others": 2, "count": 5, "next": "c1"}
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.fetches(ROOM_ENDPOINT)[-1] == f"{ROOM_ENDPOINT}?after=c1"


def test_a_member_a_poll_pushes_off_the_first_page_is_paged_again(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    c.tick(POLL_MS)
    c.answer(
        ROOM_ENDPOINT,
        {
            "members": {"1": member("Ann"), "2": member("Bob")},
            "others": 2,
            "count": 4,
            "next": "c2",
        },
    )
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.answer(
        ROOM_ENDPOINT,
        {"members": {"3": member("Cy"), "4": member("Dan")}, "others": 2, "count": 4, "next": None},
    )
    c.tick(POLL_MS)
    # Zed, a new contact of the viewer, is listed first: Bob (still in) is on the next page.
    c.answer(
        ROOM_ENDPOINT,
        {
            "members": {"9": member("Zed"), "1": member("Ann")},
            "others": 3,
            "count": 5,
            "next": "c1",
        },
    )
    assert view(c) == {"members": ["1", "3", "4", "9"], "others": 1, "count": 5, "next": "c1"}
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    assert c.fetches(ROOM_ENDPOINT)[-1] == f"{ROOM_ENDPOINT}?after=c1"
    c.answer(
        ROOM_ENDPOINT,
        {"members": {"2": member("Bob"), "3": member("Cy")}, "others": 3, "count": 5, "next": "c3"},
    )
    assert sorted(shown(c)) == ["1", "2", "3", "4", "9"]  # (ids as keys: listed by number)
    assert view(c)["others"] == 0


def test_a_page_read_while_a_poll_takes_a_fresh_cursor_keeps_it(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    c.tick(POLL_MS)
    c.answer(
        ROOM_ENDPOINT,
        {
            "members": {"1": member("Ann"), "2": member("Bob")},
            "others": 2,
            "count": 4,
            "next": "c2",
        },
    )
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    c.tick(POLL_MS)  # a poll while the page is read: Zed pushes Bob off the first page
    c.answer(
        ROOM_ENDPOINT,
        {
            "members": {"9": member("Zed"), "1": member("Ann")},
            "others": 3,
            "count": 5,
            "next": "c1",
        },
        nth=1,
    )
    c.answer(
        ROOM_ENDPOINT,
        {"members": {"3": member("Cy"), "4": member("Dan")}, "others": 3, "count": 5, "next": None},
    )
    # The page followed the old first page: its end is not the fresh one's, Bob is still to come.
    assert view(c) == {"members": ["1", "3", "4", "9"], "others": 1, "count": 5, "next": "c1"}


# --- counts ---------------------------------------------------------------------------------------


def test_a_page_read_over_http_that_counts_nobody_shows_0(client: Callable[..., Client]) -> None:
    c = client(ROOM, init="delete window.WebSocket;")
    c.tick(POLL_MS)
    c.answer(ROOM_ENDPOINT, first_read())
    c.js("() => { window.__page = presence.room('doc:7').more(); }")
    # Everyone left meanwhile: the page is empty, and counts 0.
    c.answer(ROOM_ENDPOINT, {"members": {}, "others": 0, "count": 0, "next": None})
    assert view(c)["count"] == 0
    assert c.js("() => document.querySelector('[data-presence-room-count]').textContent") == "0"
