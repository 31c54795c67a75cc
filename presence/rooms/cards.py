"""Member cards: how a member is shown (a name and an avatar) in rooms and friends lists; and
the rooms' HTTP answer and template tag with each listed member's name and card
(:func:`with_names`: ``room_presence`` carries ids only, names are the site's).

``PRESENCE["MEMBER_CARD"]`` names ``card(user) -> {"name": str, "avatar": url or None}``; without
it a member's card is their full name, else their username, and no avatar (the page shows the
name's initials instead). Cards are the site's data, not presence's: they are added only to the
members a viewer is listed (those the viewer may see), so a card reveals nothing the list does
not. A hidden member's card is never computed.

Cost: a card is computed once per user per read, whatever the number of viewers: one query for
the users (where only their ids are known) and one call of the site's function per user; the
default cards of a user model named as Django's are read as its name columns alone. A
room's HTTP answer, ``{% room_presence %}`` and a ``room_state`` are one read each; the hub's
delivery of one room's ``room_diff`` frames to all its viewers in a process is one read too (the
users who join some viewer's list in that window). A site whose function is slow (a remote
avatar service) should cache inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import FieldDoesNotExist
from django.utils.module_loading import import_string

from presence.conf import get_settings
from presence.users import parse_user_id

logger = logging.getLogger("presence")

Card = dict[str, Any]


def display_name(user: Any) -> str:
    """The user's full name where the user model has one, else the username."""
    full_name = getattr(user, "get_full_name", None)
    name = full_name() if callable(full_name) else ""
    return str(name or "").strip() or str(user.get_username())


def default_card(user: Any) -> Card:
    """The card of a site without ``MEMBER_CARD``: the display name, no avatar."""
    return {"name": display_name(user), "avatar": None}


@cache
def _imported(path: str) -> Callable[[Any], Any] | None:
    try:
        found = import_string(path)
    except Exception:  # (not only ImportError: ".card" is a ValueError, a module may raise)
        found = None
    if not callable(found):
        # presence.E013 reports it; members are shown by their default cards meanwhile.
        logger.error("Presence: MEMBER_CARD %r is not an importable function", path)
        return None
    return found


def card_function() -> Callable[[Any], Any] | None:
    """The site's ``card(user)``, or None for the default card."""
    path = get_settings().MEMBER_CARD
    if path is None:
        return None
    if callable(path):
        return path
    return _imported(path) if isinstance(path, str) and path else None


def member_card(user: Any) -> Card:
    """``{"name": str, "avatar": str | None}`` for ``user``, from the site's function if any.
    What it returns is checked: a name that is not a non-empty string is replaced by the
    default one, an avatar that is not a non-empty string by None; a function that raises is
    logged and the default card used (one member's card never breaks a room)."""
    default = default_card(user)
    function = card_function()
    if function is None:
        return default
    try:
        found = function(user)
    except Exception:
        logger.exception("Presence: MEMBER_CARD raised for user %s", user.pk)
        return default
    if not isinstance(found, Mapping):
        logger.error("Presence: MEMBER_CARD returned %s, not a dict", type(found).__name__)
        return default
    name, avatar = found.get("name"), found.get("avatar")
    return {
        "name": name.strip() if isinstance(name, str) and name.strip() else default["name"],
        "avatar": avatar if isinstance(avatar, str) and avatar else None,
    }


async def amember_card(user: Any) -> Card:
    return await sync_to_async(member_card)(user)


def unknown_card(key: str) -> Card:
    """The card of a listed id that names no user now (deleted since they joined): the list
    still adds up to ``count``."""
    return {"name": key, "avatar": None}


def cards_for_keys(keys: Iterable[str]) -> dict[str, Card]:
    """``{key: card}`` for members' keys (their ids as text): one query, one card per user;
    keys of no user are left out."""
    pks: dict[Any, str] = {}
    for key in keys:
        try:
            pks[parse_user_id(key)] = key
        except ValueError:
            continue
    if not pks:
        return {}
    model = get_user_model()
    columns = _name_columns(model) if card_function() is None else None
    if columns is not None:
        return _default_cards(model, columns, pks)
    found = model._default_manager.filter(pk__in=list(pks))
    return {pks[user.pk]: member_card(user) for user in found if user.pk in pks}


def _name_columns(model: Any) -> tuple[str, ...] | None:
    """The columns a default card's name is made of, where the user model names its users as
    Django's do (AbstractUser's ``get_full_name``, or none, and AbstractBaseUser's
    ``get_username``), each a column of its own; None for a model that names them otherwise
    (its cards are made from its instances). A room's hundred cards read as values cost a third
    of what a hundred model instances do."""
    if getattr(model, "get_username", None) is not AbstractBaseUser.get_username:
        return None
    full_name = getattr(model, "get_full_name", None)
    if full_name is AbstractUser.get_full_name:
        columns: tuple[str, ...] = ("first_name", "last_name", model.USERNAME_FIELD)
    elif full_name is None:
        columns = (model.USERNAME_FIELD,)
    else:
        return None
    for name in columns:
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            return None
        if not getattr(field, "concrete", False) or field.is_relation:
            return None
    return columns


def _default_cards(model: Any, columns: tuple[str, ...], pks: dict[Any, str]) -> dict[str, Card]:
    """:func:`default_card` of the users of ``pks`` from their name columns (:func:`_name_columns`),
    as :func:`display_name` makes it from an instance."""
    rows = model._default_manager.filter(pk__in=list(pks)).values_list("pk", *columns)
    cards: dict[str, Card] = {}
    for pk, *names in rows:
        key = pks.get(pk)
        if key is None:
            continue
        # AbstractUser.get_full_name's rule, then the username as display_name falls back to it
        full = f"{names[0]} {names[1]}".strip() if len(names) == 3 else ""
        cards[key] = {"name": full or str(names[-1]), "avatar": None}
    return cards


async def add_cards(
    members_maps: Sequence[dict[str, dict[str, Any]]], known: Mapping[str, Card] | None = None
) -> None:
    """Give each member of these ``{key: member}`` maps (a room_state's members, room_diff
    joins) its ``card``, in place, computing each user's card once for all the maps. A member
    dict shared by several maps (one frame's joins sent to many viewers) stays shared: its
    copy with the card is made once. Cards that cannot be read (the database failing) are
    logged and left out: the frames still go, and presence.js names the members from the
    room's endpoint as it does for a frame without cards. A member dict with its card already
    is left as it is, and ``known`` cards (by key: a room's shared listing's,
    presence.rooms.shared) are not read again."""
    known = known or {}
    keys = {
        key
        for members in members_maps
        for key, member in members.items()
        if "card" not in member and key not in known
    }
    cards: dict[str, Card] = dict(known)
    if keys:
        try:
            cards.update(await sync_to_async(cards_for_keys)(list(keys)))
        except Exception:
            logger.exception("Presence: reading members' cards failed; frames go without them")
            keys = set()  # those members are left without a card, the known ones get theirs
    copies: dict[tuple[str, int], dict[str, Any]] = {}
    for members in members_maps:
        for key, member in members.items():
            if "card" in member or not (key in keys or key in known):
                continue
            carded = copies.get((key, id(member)))
            if carded is None:
                card = cards.get(key) or unknown_card(key)
                carded = copies[(key, id(member))] = {**member, "card": card}
            members[key] = carded


def with_names(state: dict[str, Any]) -> dict[str, Any]:
    """The room state with a ``name`` and a ``card`` (``{"name", "avatar"}``) in each listed
    member (the id's text for a user deleted since they joined, so that the list still adds
    up to ``count``), read in one query. The members listed are those the viewer may see, so
    a name or a card reveals nothing the list does not."""
    members: dict[str, Any] = state.get("members") or {}
    return _named(state, cards_for_keys(members))


async def awith_names(state: dict[str, Any]) -> dict[str, Any]:
    """:func:`with_names` on this event loop (its query in the database's thread)."""
    members: dict[str, Any] = state.get("members") or {}
    return _named(state, await sync_to_async(cards_for_keys)(list(members)))


def _named(state: dict[str, Any], cards: Mapping[str, Card]) -> dict[str, Any]:
    named = {}
    for key, member in (state.get("members") or {}).items():
        card = cards.get(key) or unknown_card(key)
        named[key] = {**member, "name": card["name"], "card": card}
    return {**state, "members": named}
