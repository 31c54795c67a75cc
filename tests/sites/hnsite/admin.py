# myapp/admin.py: the book's snippet (docs/getting-started.md, "The admin for moderators"), as
# the site pasted it. The site never registered a user admin of its own (a custom user model
# has none), so the guard is what keeps this module from raising NotRegistered.
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from presence.admin import PresenceUserAdminMixin

User = get_user_model()
# A site with a custom user model has no user admin until it registers one: unregister only
# the one there is (admin.site.unregister raises NotRegistered otherwise).
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class SiteUserAdmin(PresenceUserAdminMixin, UserAdmin):
    pass
