"""The demo social site showing django-live-presence (not part of the installable package)."""
