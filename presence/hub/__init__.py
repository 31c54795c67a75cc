"""Live fan-out: one hub per process (per event loop) between open connections and the others.

Interest-based: a process joins the channel-layer group of user X only while one of its
connections subscribes to X, so a change of X reaches the processes that have subscribers of X,
once each, and costs one delivery per subscribed connection there, never one per follower.

A change travels as "user X changed" (no presence in it): each hub resolves X for each of its
viewers through :func:`presence.lifecycle.apresence_for_viewers` (the one privacy resolver,
three queries and one Redis round trip per batch), compares with what each connection was last
sent, and sends a ``presence_diff`` only where the visible presence changed. A viewer who may
not see a change therefore receives nothing at all, at no different time.

Changes are delivered at the ticks of one grid per process, a tick every COALESCE_WINDOW, each
at the first tick after it and each user at most once per window (presence.hub.delivery), so
the timing of a diff depends on no change its viewer may not see: neither other users' nor
the user's own hidden ones (a relation with someone else).

The modules of this package, each below the ones that use it:

- ``registry``: the connections here and what each is a member of (watched users, accounts,
  topics): all per-connection state of the hub;
- ``groups``: the process's channel-layer groups, joins and leaves in the order decided;
- ``delivery``: coalescing and diffs; ``recovery``: resyncs after outages, layer failures and
  lag; ``messages``: the announcements that reach the process (changes, sessions, topics);
- ``tasks``: the receive, delivery and sweep loops, start and stop;
- ``hub``: the :class:`Hub` that composes them.
"""

from __future__ import annotations

from presence.hub.delivery import Proof
from presence.hub.hub import Hub
from presence.hub.registry import Connection

__all__ = ["Connection", "Hub", "Proof"]
