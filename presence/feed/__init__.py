"""The activity feed, a Django app of its own: ``INSTALLED_APPS += ["presence.feed"]`` (label
``presence_feed``). Its public functions are in :mod:`presence.feed.api`.

Nothing is imported here: this is an app package, loaded before the app registry is ready.
"""
