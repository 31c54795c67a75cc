"""Who may see whom, from the database: privacy choices and relations of many targets to one
viewer (``load``), with the targets' user rows (``load_with_users``), of many targets to many
viewers (``load_pairs``, the live fan-out), friends (``friend_ids``), and contacts and blocks
alone (``viewer_ties``, ``blocks_between``, ``contacts_among``: rooms); each in one query."""

from __future__ import annotations

from presence.relations.facts import Facts, aload, facts_query, load
from presence.relations.friends import afriend_ids, friend_ids, friends_query
from presence.relations.pairs import IDS_IN_QUERY, PairFacts, aload_pairs, load_pairs
from presence.relations.rows import (
    FactsAndUsers,
    aexisting,
    aload_with_users,
    forget_existing,
    load_with_users,
    row_builder,
)
from presence.relations.ties import (
    Ties,
    ais_invisible,
    ashown_flags,
    blocks_between,
    contacts_among,
    contacts_of,
    is_invisible,
    shown_flags,
    ties_of,
    viewer_ties,
)

__all__ = [
    "IDS_IN_QUERY",
    "Facts",
    "FactsAndUsers",
    "PairFacts",
    "Ties",
    "aexisting",
    "afriend_ids",
    "ais_invisible",
    "aload",
    "aload_pairs",
    "aload_with_users",
    "ashown_flags",
    "blocks_between",
    "contacts_among",
    "contacts_of",
    "facts_query",
    "forget_existing",
    "friend_ids",
    "friends_query",
    "is_invisible",
    "load",
    "load_pairs",
    "load_with_users",
    "row_builder",
    "shown_flags",
    "ties_of",
    "viewer_ties",
]
