"""The signals presence sends. Receivers live elsewhere (presence.receivers, site code)."""

from __future__ import annotations

from django.dispatch import Signal

#: Sent after commit when what others may see of ``user_id`` may have changed for a reason other
#: than activity: ``reason`` is "status" (set_status), "privacy" (PrivacySettings saved or
#: deleted), "contacts" (a Contact of user_id's added, changed or removed) or "block" (sent for
#: both users). One change can send more than one (set_status also saves PrivacySettings);
#: listeners should coalesce. The live layer listens to push updates to open connections.
presence_changed = Signal()
