"""The test suite's settings modules, one per site it runs against (``--ds=tests.settings.NAME``):
``base`` (pyproject.toml's default: the demo site, on SQLite or DATABASE_URL), ``email``,
``uuid``, ``hn`` and ``forum`` (the sites of tests/sites/, each a variant of `make test`),
``core_only`` and ``legacy`` (presence without the feed, run in subprocesses by
tests/feed/test_feed_app.py), ``daphne`` and ``forum_daphne`` (the daphne processes the live
tests and the forum's browser test start, tests/daphne.py)."""
