"""Waits measured in wall-clock time (``time.time()``: what is stored and compared across
processes, and what tests move), read so that a clock stepped back cannot stretch them."""

from __future__ import annotations


def passed(now: float, since: float, seconds: float) -> bool:
    """Whether ``seconds`` have passed from ``since`` to ``now``, or the clock was stepped back
    past ``since`` (NTP, a resumed VM): a wait whose length cannot be told is taken as over,
    rather than stretched by the step's length."""
    return now - since >= seconds or now < since
