"""presence.js's ``presence.self`` and ``presence.othersWith`` against scripted frames
(test_client_rules.py's stand-in socket): rooms.md's typing indicator, as written there. A
room's members always list the viewer (their own join), so the recipe counted the typist, and
everyone who typed saw their own "someone is typing"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.browser.test_client_rules import ENDPOINT, Client, member
from tests.browser.test_client_rules import chromium_browser as chromium_browser
from tests.browser.test_client_rules import client as client

ROOM = "chat:5"
VIEWER = "2"
#: presence.js loaded as {% presence_script %} renders it for user 2 (data-presence-self); it
#: runs before the harness's own tag, which then finds presence loaded and stops
SCRIPT = (
    "<script src='/static/presence.js' data-presence-socket='/ws/presence/'"
    f" data-presence-endpoint='{ENDPOINT}' data-presence-status-endpoint='/presence/api/status'"
    f" data-presence-heartbeat='30' data-presence-idle-after='300'"
    f" data-presence-self='{VIEWER}'></script>"
)
INDICATOR = "<p id='typing' hidden>Someone is typing…</p><input id='message'>"
#: docs/rooms.md's "Typing indicators on top of a room", its listener verbatim
RECIPE = """() => {
  const room = "chat:5";
  const indicator = document.getElementById("typing");
  presence.joinRoom(room, {typing: true});
  presence.on("room", ({room: r, members}) => {
    if (r !== room) return;
    // The others typing: members always lists the viewer, whose own typing is no news to them.
    indicator.hidden = presence.othersWith(members, "typing").length === 0;
  });
}"""


def typing(meta_typing: bool, name: str) -> dict[str, Any]:
    return {**member(name), "meta": {"typing": meta_typing}}


def indicator_hidden(c: Client) -> bool:
    result: bool = c.js("() => document.getElementById('typing').hidden")
    return result


def joined(c: Client) -> None:
    c.js(RECIPE)
    c.open_socket()
    c.tick(100)
    assert [f["room"] for f in c.sent("join")] == [ROOM]


def test_the_typing_recipe_leaves_the_typist_out(client: Callable[..., Client]) -> None:
    c = client(INDICATOR + SCRIPT)
    assert c.js("() => presence.self") == VIEWER
    joined(c)
    # The answer of the viewer's own join lists them, typing.
    c.receive(
        {
            "type": "room_state",
            "room": ROOM,
            "members": {VIEWER: typing(True, "Bea"), "1": typing(False, "Ann")},
            "others": 0,
            "count": 2,
            "next": None,
        }
    )
    assert indicator_hidden(c)
    # Ann starts typing: the viewer sees it.
    c.receive(
        {
            "type": "room_diff",
            "room": ROOM,
            "joins": {"1": typing(True, "Ann")},
            "leaves": [],
            "others": 0,
            "count": 2,
        }
    )
    assert not indicator_hidden(c)
    members = c.js(f"() => presence.room('{ROOM}').members")
    assert c.js("(m) => presence.othersWith(m, 'typing')", members) == ["1"]
    # A member with no meta, or another key, is nobody typing.
    others = {"3": {"meta": None}, "4": {"meta": {"mode": 1}}}
    assert c.js("(m) => presence.othersWith(m, 'typing')", others) == []


def test_without_an_id_every_member_typing_counts(client: Callable[..., Client]) -> None:
    """A page loading presence.js by a tag of its own without data-presence-self."""
    c = client(INDICATOR)
    assert c.js("() => presence.self") is None
    members = {VIEWER: typing(True, "Bea"), "1": typing(False, "Ann")}
    assert c.js("(m) => presence.othersWith(m, 'typing')", members) == [VIEWER]
