"""Credentials out of what presence prints: Redis URLs carry their password
(``redis://user:password@host:port``, ``?password=``), and checks, log lines and errors that
name a URL must not show it to whoever reads logs or ``manage.py check``."""

from __future__ import annotations

import re

# scheme://userinfo@ : the userinfo runs to the last "@" before a blank, a quote or the next
# "scheme://" (a password may hold an unencoded "@", "/" or "#", which urlsplit misreads)
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>(?:(?!://)[^\s'\"<>])*)@"
)
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&;]password=)[^&#\s'\"<>]*", re.IGNORECASE)


def _hide_userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    # A username is no secret and helps tell nodes apart; without a colon it may be a password.
    shown = f"{user}:" if colon and user else ""
    return f"{match['scheme']}{shown}***@"


def redact_url(text: str) -> str:
    """``text`` (a URL, or any text quoting URLs: a repr, an error message) with every URL's
    password replaced by ``***``: ``redis://user:***@host:6379/0``; host, port and database
    stay, so the message still says which URL it is about."""
    return _QUERY_PASSWORD.sub(r"\g<key>***", _USERINFO.sub(_hide_userinfo, text))
