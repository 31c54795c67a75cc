"""The receivers the feed connects (from ``FeedConfig.ready``), at the edge of the app: with
``RECORD_STATUS_ACTIVITIES`` on, a change of a user's custom status text is posted as an
activity of kind ``status``; and after a change of the feed's or presence's rows that can take a
timeline away (a membership ended, a group deleted or renamed, a contact, block, exception or
privacy setting changed), the users' live watches are asked ``CAN_READ`` again
(``recheck_watches``)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import router, transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.utils import timezone

from presence.feed.api import feed_key, post
from presence.feed.api.watches import announce_recheck
from presence.feed.conf import get_settings
from presence.feed.models import Activity, ActivityKind, Group, Membership
from presence.models import Block, Contact, PrivacyException, PrivacySettings, UserStatus

logger = logging.getLogger("presence")

_OLD_TEXT = "_presence_feed_old_text"


def _status_before_save(
    sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any
) -> None:
    if raw or not get_settings().RECORD_STATUS_ACTIVITIES:
        return
    setattr(instance, _OLD_TEXT, _shown_text(instance.pk))


def _shown_text(pk: Any) -> str:
    """The saved row's custom status text, "" once it cleared: a text past its expiry is shown
    to nobody, so setting it again is a change (as the resolver sees it)."""
    row = (
        UserStatus.objects.filter(pk=pk).values_list("text", "expires_at").first()
        if pk is not None
        else None
    )
    if row is None:
        return ""
    text, expires_at = row
    if expires_at is not None and expires_at <= timezone.now():
        return ""
    return text or ""


def _status_saved(sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any) -> None:
    if raw or not hasattr(instance, _OLD_TEXT):
        return
    old, new = getattr(instance, _OLD_TEXT), instance.text
    delattr(instance, _OLD_TEXT)
    if not new or new == old:
        return
    user_id = instance.user_id

    def record() -> None:
        try:
            post(user_id, new, kind=ActivityKind.STATUS)
        except Exception:  # a status change must never fail because of the feed
            logger.exception("Presence: could not record the status of user %s", user_id)

    transaction.on_commit(record, using=router.db_for_write(Activity))


# --- watches asked again (presence.feed.api.watches) ---------------------------------------
#
# CAN_READ is the site's rule, and may read any of these rows: each change that can refuse a
# watcher what they watch has the watchers concerned asked again once it is committed (a
# change rolled back asks nothing). Taking access away is what matters; a row added is asked
# about too where a rule may refuse on it (a block, a contact marked or not).

#: the attribute a Membership or Group being saved keeps its row's (user, group) or slug in
_WATCH_BEFORE = "_presence_feed_watch_before"


#: the attribute of a database connection its transaction's pending rechecks are kept in
_PENDING = "_presence_feed_pending_rechecks"


class _TransactionRechecks:
    """The watches one transaction of one database has asked again, announced together once
    it is committed (a rollback drops them): one query for the ended memberships' group names
    and at most three announcements, whatever the number of rows. Per row, deleting a user with
    thousands of contacts or a group of thousands of members sent an announcement each (and
    read a slug per membership), every one blocking the request and scanned by every
    process."""

    def __init__(self, using: str) -> None:
        self.using = using
        #: group id -> the ids of the users whose membership of it ended
        self.members: dict[Any, set[Any]] = {}
        #: the users all of whose watches are asked again (a contact, block, exception...)
        self.users: set[Any] = set()
        #: the timelines every watcher of which is asked again (a group gone, a user's privacy)
        self.feeds: set[str] = set()
        # The callable handed to on_commit (Django keeps that object, in a new tuple after a
        # savepoint's rollback), the list of hooks it was in and where: is_pending looks there
        # first rather than reading every hook of the transaction on each row.
        self._hook: Any = None
        self._hooks: list[Any] | None = None
        self._index = -1

    @classmethod
    def of(cls, using: str | None, model: type[Any]) -> _TransactionRechecks:
        """The rechecks of the transaction in progress on ``using`` (``model``'s database for
        writes if None), made with its first row (outside a transaction, each row has its
        own, flushed at once by ``hook_if_fresh``)."""
        alias = using or router.db_for_write(model)
        connection = transaction.get_connection(alias)
        pending: _TransactionRechecks | None = getattr(connection, _PENDING, None)
        if pending is None or not pending.is_pending(connection):
            pending = cls(alias)
            setattr(connection, _PENDING, pending)
        return pending

    def hook_if_fresh(self) -> None:
        """Flush once committed (at once outside a transaction), hooked with the first row."""
        if self._hook is not None:
            return
        connection = transaction.get_connection(self.using)
        in_transaction = connection.in_atomic_block
        hook = self.flush  # one bound method, told from any other hook by identity
        transaction.on_commit(hook, using=self.using)  # run now in autocommit
        if in_transaction:
            self._hook, self._hooks = hook, connection.run_on_commit
            self._index = len(self._hooks) - 1

    def is_pending(self, connection: Any) -> bool:
        """Whether its flush still waits for the commit (a rollback drops it: these rows must
        not be announced with a later transaction's). O(1) but after a savepoint's rollback
        (Django rebuilt the list, at a cost of its own as great: the hook is looked for once)."""
        if self._hook is None:
            return False
        hooks: list[Any] = connection.run_on_commit
        index = self._index
        if hooks is self._hooks and index < len(hooks) and hooks[index][1] is self._hook:
            return True
        # A new list: a rollback (the hook gone), a commit (run), or a savepoint rolled back
        # (kept if registered outside it, maybe further up).
        for index in range(len(hooks) - 1, -1, -1):
            if hooks[index][1] is self._hook:
                self._hooks, self._index = hooks, index
                return True
        return False

    def flush(self) -> None:
        connection = transaction.get_connection(self.using)
        if getattr(connection, _PENDING, None) is self:
            delattr(connection, _PENDING)
        self._hook = None  # run: no longer pending
        # Each announcement on its own: one failing must not lose the others.
        try:
            if self.members:
                self._announce_ended_memberships()
        except Exception:  # a change of the rows must never fail because of live watches
            logger.exception("Presence: could not ask the feed's watches again")
        announcements: list[tuple[list[Any] | None, list[str] | None]] = []
        if self.users:
            announcements.append((sorted(self.users, key=str), None))
        if self.feeds:
            announcements.append((None, sorted(self.feeds)))
        for users, feeds in announcements:
            try:
                announce_recheck(users, feeds)
            except Exception:  # a change of the rows must never fail because of live watches
                logger.exception("Presence: could not ask the feed's watches again")

    def _announce_ended_memberships(self) -> None:
        groups = Group.objects.using(self.using).filter(pk__in=list(self.members))
        slugs = dict(groups.values_list("pk", "slug"))
        # A group gone with the transaction asked every watcher of it (_group_deleted); a user
        # asked about all their watches needs no group named.
        ended = {slug: self.members[pk] - self.users for pk, slug in slugs.items()}
        ended = {slug: users for slug, users in ended.items() if users}
        if ended:
            # One announcement: every member asked about every group; a pair more is one more
            # CAN_READ asked (answered as it stands), never a watch left unasked.
            users = sorted({user for users in ended.values() for user in users}, key=str)
            announce_recheck(users, [f"group:{slug}" for slug in ended])


def _recheck_after_commit(
    model: type[Any],
    using: str | None,
    users: list[Any] | None = None,
    feeds: list[str] | None = None,
) -> None:
    """Ask these users' watches (``users``) or every watch of these timelines (``feeds``)
    again once the transaction is committed, with the rest of its rows."""
    pending = _TransactionRechecks.of(using, model)
    pending.users.update(users or ())
    pending.feeds.update(feeds or ())
    pending.hook_if_fresh()


def _membership_saving(sender: Any, instance: Membership, raw: bool = False, **kwargs: Any) -> None:
    if raw or instance.pk is None:
        return
    row = (
        Membership.objects.using(kwargs.get("using"))
        .filter(pk=instance.pk)
        .values_list("user_id", "group_id")
        .first()
    )
    setattr(instance, _WATCH_BEFORE, row)


def _membership_saved(sender: Any, instance: Membership, raw: bool = False, **kwargs: Any) -> None:
    before = getattr(instance, _WATCH_BEFORE, None)
    if before is None:
        return
    delattr(instance, _WATCH_BEFORE)
    if before != (instance.user_id, instance.group_id):
        # Moved to another user or group (the admin's inline): the old membership ended.
        _membership_ended(before[0], before[1], kwargs.get("using"))


def _membership_deleted(sender: Any, instance: Membership, **kwargs: Any) -> None:
    # feed.leave, the admin, a group's or user's cascade: the member's watches of the group.
    _membership_ended(instance.user_id, instance.group_id, kwargs.get("using"))


def _membership_ended(user_id: Any, group_id: Any, using: str | None) -> None:
    pending = _TransactionRechecks.of(using, Membership)
    pending.members.setdefault(group_id, set()).add(user_id)
    pending.hook_if_fresh()


def _group_saving(sender: Any, instance: Group, raw: bool = False, **kwargs: Any) -> None:
    if raw or instance.pk is None:
        return
    slug = Group.objects.using(kwargs.get("using")).filter(pk=instance.pk)
    setattr(instance, _WATCH_BEFORE, slug.values_list("slug", flat=True).first())


def _group_saved(sender: Any, instance: Group, raw: bool = False, **kwargs: Any) -> None:
    before = getattr(instance, _WATCH_BEFORE, None)
    if before is None:
        return
    delattr(instance, _WATCH_BEFORE)
    if before != instance.slug:
        # group:<old slug> names no group any more: its watchers are told so.
        _recheck_after_commit(Group, kwargs.get("using"), feeds=[f"group:{before}"])


def _group_deleted(sender: Any, instance: Group, **kwargs: Any) -> None:
    _recheck_after_commit(Group, kwargs.get("using"), feeds=[f"group:{instance.slug}"])


def _between_changed(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    # A contact, block or exception is a relation of two users: either's watches may change.
    if raw:
        return
    fields = {Contact: ("owner_id", "contact_id"), Block: ("blocker_id", "blocked_id")}
    one, other = fields.get(sender, ("owner_id", "viewer_id"))
    users = [getattr(instance, one), getattr(instance, other)]
    _recheck_after_commit(sender, kwargs.get("using"), users=users)


def _privacy_changed(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    if raw:
        return
    # Who watches the user's timeline, and what the user watches.
    _recheck_after_commit(
        sender,
        kwargs.get("using"),
        users=[instance.user_id],
        feeds=[f"user:{feed_key(instance.user_id)}"],
    )


def _connect_rechecks() -> None:
    pre_save.connect(_membership_saving, sender=Membership, dispatch_uid="presence_feed_m_pre")
    post_save.connect(_membership_saved, sender=Membership, dispatch_uid="presence_feed_m_post")
    post_delete.connect(
        _membership_deleted, sender=Membership, dispatch_uid="presence_feed_m_deleted"
    )
    pre_save.connect(_group_saving, sender=Group, dispatch_uid="presence_feed_g_pre")
    post_save.connect(_group_saved, sender=Group, dispatch_uid="presence_feed_g_post")
    post_delete.connect(_group_deleted, sender=Group, dispatch_uid="presence_feed_g_deleted")
    for model in (Contact, Block, PrivacyException):
        for signal in (post_save, post_delete):
            signal.connect(
                _between_changed,
                sender=model,
                dispatch_uid=f"presence_feed_watch_{model.__name__}_{signal is post_save}",
            )
    for signal in (post_save, post_delete):
        signal.connect(
            _privacy_changed,
            sender=PrivacySettings,
            dispatch_uid=f"presence_feed_watch_privacy_{signal is post_save}",
        )


def connect() -> None:
    """Record custom status text changes as activities when ``RECORD_STATUS_ACTIVITIES`` is on
    (connected from ``AppConfig.ready``; the setting is read at each save), and ask live
    watches again after the changes that can take a timeline away."""
    _connect_rechecks()
    pre_save.connect(
        _status_before_save, sender=UserStatus, dispatch_uid="presence_feed_status_pre"
    )
    post_save.connect(_status_saved, sender=UserStatus, dispatch_uid="presence_feed_status_post")
