"""The demo's user admin: Django's own, with presence's columns, filter and inlines added the
way a site adds them (presence never re-registers a site's user admin)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from presence.admin import PresenceUserAdminMixin

User = get_user_model()

# As docs/getting-started.md prints it: a site with a custom user model has no user admin
# until it registers one, and unregister raises NotRegistered for a model never registered.
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class DemoUserAdmin(PresenceUserAdminMixin, UserAdmin):
    pass
