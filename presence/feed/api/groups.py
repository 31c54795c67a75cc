"""Groups: joining, leaving, membership."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, router, transaction

from presence.feed.api.posting import _author_pk
from presence.feed.models import Group, Membership
from presence.users import viewer_pk as _viewer_pk_of


def join(user: Any, group: Group) -> bool:
    """Make ``user`` a member of ``group``; False if they already were."""
    try:
        with transaction.atomic(using=router.db_for_write(Membership)):
            _, created = Membership.objects.get_or_create(group=group, user_id=_author_pk(user))
    except IntegrityError:  # joined at the same moment elsewhere
        return False
    return created


def leave(user: Any, group: Group) -> bool:
    """End ``user``'s membership of ``group``; False if they were no member."""
    deleted, _ = Membership.objects.filter(group=group, user_id=_author_pk(user)).delete()
    return deleted > 0


def is_member(user: Any, group: Group) -> bool:
    user_pk = _viewer_pk_of(user)
    return user_pk is not None and Membership.objects.filter(group=group, user=user_pk).exists()
