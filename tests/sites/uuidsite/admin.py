"""The UUID site's user admin, added the way a site adds presence's columns, filter and inlines
(as the demo does for its user model)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from presence.admin import PresenceUserAdminMixin
from tests.sites.uuidsite.models import User


@admin.register(User)
class UuidUserAdmin(PresenceUserAdminMixin, UserAdmin):
    pass
