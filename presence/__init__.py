"""django-live-presence: who is online, last seen and online friends for Django."""

__version__ = "0.1.0"
