"""System checks for presence's configuration, a module per area; importing the package
registers them all (presence.apps). Ids are stable; each has a hint (docs/checks.md).

- :mod:`~presence.checks.settings` -- ``PRESENCE``'s values (E001-E003, E010, E015, W001, W003,
  W006);
- :mod:`~presence.checks.rooms` -- the rooms' and member cards' values, part of
  ``check_settings`` (E011-E013);
- :mod:`~presence.checks.connections` -- Redis, Redis Cluster and the channel layer (E004, E005,
  E009, W002);
- :mod:`~presence.checks.site` -- middleware, user model, time zone support, templates
  (E006-E008, E014, W004).

The database's checks are :mod:`presence.database_checks`.
"""

from __future__ import annotations

from presence.checks.connections import check_cache, check_channel_layer, check_redis_cluster
from presence.checks.settings import check_settings
from presence.checks.site import (
    REQUEST_CONTEXT_PROCESSOR,
    check_middleware,
    check_request_context_processor,
    check_time_zone_support,
    check_user_model,
)

__all__ = [
    "REQUEST_CONTEXT_PROCESSOR",
    "check_cache",
    "check_channel_layer",
    "check_middleware",
    "check_redis_cluster",
    "check_request_context_processor",
    "check_settings",
    "check_time_zone_support",
    "check_user_model",
]
