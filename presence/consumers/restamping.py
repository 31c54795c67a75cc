"""Fresh stamps for long-lived connections (docs/websocket.md, "Fresh stamps").

A client resumes with the stamp of its last answer; past RESUME_WINDOW that stamp proves nothing
and a reconnect gets the full snapshot, though the client was sent every diff; within it, a
reconnect is sent again every user changed since the stamp (stamps are per user: the diffs it
was sent, and changes it may not see, resolved as it sees them), a server restart's resumes
all at once. So a connection whose client holds a stamp is sent a fresh one once its own is
:func:`restamp_after` old (two heartbeat intervals, at most half the window), as soon as the
hub proves every change announced before the fresh stamp's time has been delivered to it
(:meth:`presence.hub.Hub.probe`): ``{"type": "stamp", "stamp": ...}``.

Driven by the client's heartbeats: the first heartbeat due starts the proof, a heartbeat at
least half a HEARTBEAT_INTERVAL later sends the stamp if it is proven (else a later one does).
When the frame goes out depends on the client's beats alone, never on how soon the deliveries of
its users were done nor on whether any changed: it tells the viewer nothing of changes it may
not see. A short page view (under two heartbeat intervals) gets no such frame.
"""

from __future__ import annotations

from presence import stamps
from presence.conf import STAMP_SLACK, PresenceSettings, get_settings
from presence.consumers.state import Socket
from presence.domain import passed

#: the frame's type
STAMP = "stamp"


def restamp_after(conf: PresenceSettings) -> float:
    """How old a client's stamp may grow before it is sent a fresh one."""
    return min(conf.RESUME_WINDOW / 2, 2 * conf.HEARTBEAT_INTERVAL)


async def heartbeat(socket: Socket, now: float) -> None:
    """On a heartbeat (``now``): start proving a fresh stamp once the client's is
    :func:`restamp_after` old; send it once proven, at a heartbeat half an interval after the
    proof began."""
    subscriptions = socket.state.subscriptions
    if not subscriptions.restamp_due(now) or not socket.attached:
        return
    conf = get_settings()
    if not subscriptions.sent:
        subscriptions.restamp_in(now, restamp_after(conf))
        return  # nothing shown to keep fresh (answers to later subscribes carry their own)
    half_a_beat = socket.state.heartbeat_interval / 2
    proof = subscriptions.proof
    if proof is not None and now < proof.at:
        # The clock was stepped back past the proof's start: a stamp of its time would be
        # from the future, which proves nothing. A new proof.
        proof = None
    if proof is not None:
        if socket.hub.proven(socket, proof):
            # A margin below the probe: an announcement sent up to STAMP_SLACK after its
            # change stamp still falls after the fresh stamp (read with STAMP_SLACK again).
            at = proof.at - STAMP_SLACK
            subscriptions.proof = None
            subscriptions.restamp_in(at, restamp_after(conf))
            await socket.send_json({"type": STAMP, "stamp": stamps.mint(socket.viewer_id, at)})
            return
        if not passed(now, proof.at, conf.RESUME_WINDOW / 4):
            subscriptions.restamp_in(proof.at, half_a_beat)
            return  # still waiting (a delivery held up): a later heartbeat looks again
    # None under way, or one held up too long (an outage, a lost probe): a new one.
    subscriptions.proof = proof = await socket.hub.probe(socket)
    subscriptions.restamp_in(proof.at, half_a_beat)
