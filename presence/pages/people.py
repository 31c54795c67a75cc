"""Who the settings page lists for per-person exceptions: the owner's contacts, and anyone the
owner already has an exception for (so that it can be seen and removed), with the exceptions
the owner has for each."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import CharField, Exists, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Concat

from presence.api import display_name
from presence.models import Contact, PrivacyException
from presence.users import parse_user_id, pk_kind

#: most people one page lists (and one save may change); a search finds the others
SHOWN_MAX = 100
ALWAYS, NEVER = "always", "never"


@dataclass
class Person:
    pk: Any
    name: str
    #: the owner has this person among their contacts (only contacts get new exceptions)
    is_contact: bool
    #: setting -> ALWAYS or NEVER, for the owner's exceptions for this person
    current: dict[str, str] = field(default_factory=dict)
    #: what the search (?q=) matches, one per line: the page's filter (settings.js) matches it too
    searched: str = ""

    @property
    def key(self) -> str:
        return str(self.pk)


def _candidates(owner: Any) -> QuerySet[Any]:
    them = OuterRef("pk")
    return (
        get_user_model()
        ._default_manager.annotate(
            is_contact=Exists(Contact.objects.filter(owner=owner, contact=them)),
            excepted=Exists(PrivacyException.objects.filter(owner=owner, viewer=them)),
        )
        .filter(Q(is_contact=True) | Q(excepted=True))
        .exclude(pk=owner.pk)
    )


def _searched_fields(model: Any) -> list[str]:
    """The username (the model's USERNAME_FIELD) and first and last name: those the user model
    has."""
    names = []
    for name in [model.USERNAME_FIELD, "first_name", "last_name"]:
        try:
            model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        names.append(name)
    return names


def _search(queryset: QuerySet[Any], query: str) -> QuerySet[Any]:
    """Users whose username, first or last name, or full name ("first last", the name the
    page shows) holds ``query``: the page's filter (settings.js) matches the name shown, and
    "John Smith" typed there must find John Smith once submitted too."""
    searched = _searched_fields(queryset.model)
    matches = Q(pk__in=[])
    for name in searched:
        matches |= Q(**{f"{name}__icontains": query})
    if "first_name" in searched and "last_name" in searched:
        # As AbstractUser.get_full_name spells it.
        full_name = Concat("first_name", Value(" "), "last_name", output_field=CharField())
        queryset = queryset.alias(presence_full_name=full_name)
        matches |= Q(presence_full_name__icontains=query)
    return queryset.filter(matches)


def _searched(user: Any) -> str:
    values = (getattr(user, name, None) for name in _searched_fields(type(user)))
    return "\n".join(str(value) for value in values if value)


def _people(owner: Any, users: Iterable[Any]) -> list[Person]:
    people = [
        Person(u.pk, display_name(u), bool(u.is_contact), searched=_searched(u)) for u in users
    ]
    by_pk = {person.pk: person for person in people}
    rows = PrivacyException.objects.filter(owner=owner, viewer__in=list(by_pk))
    for row in rows:
        by_pk[row.viewer_id].current[row.setting] = ALWAYS if row.allow else NEVER
    return people


def listed(owner: Any, query: str = "") -> tuple[list[Person], int]:
    """The people the page lists for ``owner`` (those matching ``query``), those with an
    exception first, then by username; at most SHOWN_MAX. And how many matched in all."""
    candidates = _candidates(owner)
    if query:
        candidates = _search(candidates, query)
    username = get_user_model().USERNAME_FIELD
    ordered = candidates.order_by("-excepted", username, "pk")
    return _people(owner, ordered[:SHOWN_MAX]), candidates.count()


def named(owner: Any, raw_ids: Iterable[str]) -> dict[str, Person]:
    """The people among ``raw_ids`` (ids as a form posted them) whom the page may list for
    ``owner``, by their canonical id (``Person.key``); ids of anyone else are left out."""
    kind = pk_kind()
    pks = set()
    for raw in raw_ids:
        try:
            pks.add(parse_user_id(raw, kind))
        except ValueError:
            continue
    if not pks:
        return {}
    people = _people(owner, _candidates(owner).filter(pk__in=pks))
    return {person.key: person for person in people}
