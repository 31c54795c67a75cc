"""presence.users: ids of integer, UUID and string primary keys, their one canonical form in
Redis and channel-layer messages, the buckets they fall in, and what clients may send."""

from __future__ import annotations

import binascii
import uuid
from typing import Any

import pytest

from presence import users
from presence.announce import account_group_name, group_name
from presence.conf import PresenceSettings
from presence.store.keys import KeyScheme

pytestmark = [pytest.mark.uuid_site]

UID = uuid.UUID("0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10")


@pytest.mark.parametrize(
    ("pk", "encoded"),
    [
        (7, 7),
        (2**63 - 1, 2**63 - 1),
        (UID, "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"),
        ("alice", "alice"),
        # ":" separates a member's parts in Redis, so a string pk's ":" (and "%") are escaped.
        ("a:b", "a%3Ab"),
        ("50%:x", "50%25%3Ax"),
        ("a%3Ab", "a%253Ab"),
    ],
)
def test_the_canonical_form_and_back(pk: Any, encoded: Any) -> None:
    assert users.encode_id(pk) == encoded
    kind: users.PkKind = (
        "int" if isinstance(pk, int) else "uuid" if isinstance(pk, uuid.UUID) else "str"
    )
    decode = users.id_decoder(kind)
    assert decode(encoded) == pk
    assert decode(str(encoded).encode()) == pk  # as Redis answers: bytes


def test_no_string_pk_encodes_to_a_prefix_of_another_ones_member() -> None:
    # A connection's member is "<user>:<expiry>:<connection>": user "a" must not own "a:b"'s.
    assert not str(users.encode_id("a:b")).startswith(str(users.encode_id("a")) + ":")


def scheme(**overrides: Any) -> KeyScheme:
    conf = PresenceSettings(**overrides)
    return KeyScheme(conf)


def test_integer_ids_keep_their_bucket() -> None:
    keys = scheme(BUCKETS=16384)
    assert [keys.bucket_of(n) for n in (0, 1, 16383, 16384, 16384 + 42)] == [0, 1, 16383, 0, 42]


@pytest.mark.parametrize("pk", [UID, "alice", "a:b"])
def test_other_ids_fall_in_the_bucket_of_the_crc32_of_their_canonical_form(pk: Any) -> None:
    # The same in every process and Python version (hash() of a str is salted per process).
    keys = scheme(BUCKETS=16384)
    expected = binascii.crc32(str(users.encode_id(pk)).encode()) % 16384
    assert keys.bucket_of(pk) == expected
    assert keys.bucket_of(UID) == binascii.crc32(b"0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10") % 16384


def test_uuids_spread_over_the_buckets() -> None:
    keys = scheme(BUCKETS=64)
    buckets = {keys.bucket_of(uuid.UUID(int=n * 7919 + 1)) for n in range(2000)}
    assert len(buckets) == 64


def test_on_a_cluster_a_uuid_users_keys_and_due_time_share_one_slot() -> None:
    from redis.crc import key_slot

    keys = scheme(REDIS_CLUSTER=["redis://127.0.0.1:7000"], CLUSTER_SHARDS=256)
    bucket = keys.bucket_of(UID)
    slots = {
        key_slot(key.encode())
        for key in (
            keys.seen_key(bucket),
            keys.conns_key(bucket),
            keys.expiries_key(bucket),
            keys.user_due_key(UID),
            keys.user_expiring_key(UID),
        )
    }
    assert len(slots) == 1


@pytest.mark.parametrize(
    ("value", "kind", "pk"),
    [
        (7, "int", 7),
        ("7", "int", 7),
        ("0", "int", 0),
        (str(2**63 - 1), "int", 2**63 - 1),
        (str(UID), "uuid", UID),
        (str(UID).upper(), "uuid", UID),
        (UID.hex, "uuid", UID),
        ("alice", "str", "alice"),
        (42, "str", "42"),
    ],
)
def test_what_clients_may_send(value: Any, kind: users.PkKind, pk: Any) -> None:
    assert users.parse_user_id(value, kind) == pk


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("abc", "int"),
        ("-1", "int"),
        ("1.5", "int"),
        (" 7", "int"),
        ("²", "int"),
        ("1" * 20, "int"),
        (str(2**63), "int"),
        (-1, "int"),
        (True, "int"),
        (1.0, "int"),
        (None, "int"),
        ("", "str"),
        ("x" * 256, "str"),
        ("not-a-uuid", "uuid"),
        (str(UID)[:-1], "uuid"),
        (5, "uuid"),  # a UUID is spelt as a string
        ([str(UID)], "uuid"),
    ],
)
def test_what_no_pk_can_be_is_refused(value: Any, kind: users.PkKind) -> None:
    with pytest.raises(ValueError):
        users.parse_user_id(value, kind)


@pytest.mark.parametrize(
    ("pk", "part"),
    [
        (7, "7"),
        (UID, "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"),
        ("alice_1.x-y", "alice_1.x-y"),
    ],
)
def test_group_names_carry_ids_they_can_hold_as_they_are(pk: Any, part: str) -> None:
    assert group_name(pk) == f"presence.user.{part}"
    assert account_group_name(pk) == f"presence.account.{part}"


@pytest.mark.parametrize("pk", ["ann@example.com", "a b", "ü", "x" * 41])
def test_other_string_ids_are_digested_in_group_names(pk: str) -> None:
    # Channel-layer group names allow only [a-zA-Z0-9-_.] and fewer than 100 characters.
    name = account_group_name(pk)
    assert name.startswith("presence.account.h-") and len(name) < 100
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)
    assert account_group_name(pk + "!") != name


def test_the_pk_kind_is_looked_up_once_until_the_user_model_changes(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Every reply naming users is decoded by the pk's kind: the user model is looked up once,
    not per reply, and again once AUTH_USER_MODEL changes."""
    kind = users.pk_kind()
    looked_up: list[object] = []
    real = users.pk_field

    def counted(model: Any = None) -> Any:
        looked_up.append(model)
        return real(model)

    monkeypatch.setattr(users, "pk_field", counted)
    assert [users.pk_kind() for _ in range(3)] == [kind] * 3
    assert looked_up == []
    settings.AUTH_USER_MODEL = settings.AUTH_USER_MODEL  # setting_changed, as a test's override
    assert users.pk_kind() == kind
    assert users.pk_kind() == kind
    assert len(looked_up) == 1
