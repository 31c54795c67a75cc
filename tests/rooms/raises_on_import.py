"""A site module that raises while it is imported (the checks and the rooms' fallbacks must
report it, not crash): named by paths in tests/rooms, never imported by the tests themselves."""

raise RuntimeError("this module of the site is broken")
