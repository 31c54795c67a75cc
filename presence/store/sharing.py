"""Clients shared by a process's threads: one handed out, whichever thread asks first."""

from __future__ import annotations

import threading
from typing import Any


def publish_once(holder: Any, name: str, made: Any, lock: threading.Lock) -> Any:
    """``holder.name`` set to the client ``made`` unless another thread set one first; the
    client to use. Threads that ask for a new store's client at once each make one (outside the
    lock: a cluster's reads its slot table over the network), and only the first is handed
    out: the others are closed here, never used. A client made and dropped instead would close
    its pool as it is collected, cutting off whatever had used it (the closes listener's
    subscription)."""
    with lock:
        current = getattr(holder, name)
        if current is None:
            setattr(holder, name, made)
            return made
    made.close()
    return current
