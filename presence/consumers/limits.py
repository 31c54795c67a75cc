"""What a connection may ask of the server: the close codes that end it, and the per-connection
RATE_LIMIT with the weight of each frame (the ids it names, the bytes of its answer)."""

from __future__ import annotations

import contextvars
import math
from collections import deque

#: close codes (docs/websocket.md, "Close codes")
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FOREIGN_ORIGIN = 4403
CLOSE_RATE_LIMITED = 4429
#: also past MAX_CONNECTIONS_PER_USER (the user's other connections stay open)
CLOSE_TOO_MANY_CONNECTIONS = CLOSE_RATE_LIMITED
#: closes a connection whose client does not take what it is sent: the bytes the server still
#: holds for it passed MAX_UNSENT_BYTES, or the server took no frame for SEND_TIMEOUT
CLOSE_TOO_SLOW = 4408

#: a subscribe or unsubscribe of n user ids counts as ceil(n / IDS_PER_FRAME) frames of
#: RATE_LIMIT (each id costs channel-layer and Redis work; a frame may carry a thousand)
IDS_PER_FRAME = 100
#: a room's join counts one frame of RATE_LIMIT per whole ROOM_MEMBERS_PER_FRAME members whose
#: privacy and live state its read resolved (at least one): a viewer who may see few members
#: makes the read go down to 32 x ROOM_LIST_LIMIT of them (docs/rooms.md, "Large rooms")
ROOM_MEMBERS_PER_FRAME = 200
#: each whole ANSWER_BYTES_PER_FRAME bytes of the answer to a client's frame count as one more
#: frame of RATE_LIMIT: a small frame may ask for a large answer (docs/websocket.md)
ANSWER_BYTES_PER_FRAME = 64 * 1024

#: bytes of the answers to the client frame being handled (consumers.frames.receive sets it, send
#: adds to it): a context variable, so that what the hub sends the connection meanwhile is not
#: counted
answer_bytes: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "presence_answer_bytes", default=None
)


class RateLimit:
    """At most ``frames`` frames in any ``seconds``-long window (a sliding log); a frame may
    weigh more than one."""

    def __init__(self, frames: int, seconds: float) -> None:
        self.frames = frames
        self.seconds = seconds
        self._log: deque[tuple[float, int]] = deque()
        self._used = 0

    def allow(self, now: float, cost: int = 1) -> bool:
        self._slide(now)
        # A frame heavier than the whole budget may still pass, alone in its window.
        cost = min(cost, self.frames)
        if self._used + cost > self.frames:
            return False
        self._log.append((now, cost))
        self._used += cost
        return True

    def charge(self, now: float, cost: int) -> None:
        """Count ``cost`` more frames now, as far as the budget goes (what an answer weighed):
        the frames that no longer fit are refused."""
        self._slide(now)
        cost = min(cost, self.frames - self._used)
        if cost > 0:
            self._log.append((now, cost))
            self._used += cost

    def _slide(self, now: float) -> None:
        """The frames older than the window leave it. A clock stepped back (NTP) leaves frames
        logged "after" now, which would hold the window full for the step's length: they are
        forgiven (at most one window's worth, once)."""
        if self._log and self._log[-1][0] > now:
            self._log.clear()
            self._used = 0
        while self._log and self._log[0][0] <= now - self.seconds:
            self._used -= self._log.popleft()[1]


def frame_cost(user_ids: int) -> int:
    """What a subscribe or unsubscribe of this many ids counts against RATE_LIMIT."""
    return max(1, math.ceil(user_ids / IDS_PER_FRAME))


def join_cost(resolved: int) -> int:
    """What a room's join whose read resolved this many members counts against RATE_LIMIT."""
    return max(1, resolved // ROOM_MEMBERS_PER_FRAME)
