"""The support matrix: each Python with each Django it is supported on, in a virtualenv of its
own under .nox/ (never .venv), the project installed with its dev extra and that Django pinned.

    make matrix                          # smoke of every pair but the default (what CI runs)
    .venv/bin/nox -s "smoke-3.12-6.1"    # one pair's smoke (nox -l lists the sessions)
    .venv/bin/nox -s "tests-3.13-6.1"    # one pair's whole suite, with every variant
    .venv/bin/nox -t full                # every pair's whole suite (long: ~15 min a pair)

The default pair (MATRIX[0], .venv's) gets the whole suite from `make test` in CI; the others
a smoke. README's "Requirements", docs/getting-started.md's table and pyproject's classifiers
name exactly these pairs (tests/core/test_requirements_doc.py reads MATRIX from here).
Interpreters are found on PATH, or among pyenv's installed versions.
"""

from __future__ import annotations

import glob
import os

import nox

#: (Python, Django) pairs CI runs; the first is the default pair, .venv's
MATRIX = [
    ("3.11", "5.2"),
    ("3.12", "5.2"),
    ("3.13", "5.2"),
    ("3.12", "6.1"),
    ("3.13", "6.1"),
]

#: About a minute a pair: the store, the consumers (snapshots, diffs, bad input), the JSON
#: endpoints (the privacy matrix on each), the template tags, the feed's views, the migrations
#: against this Django's autodetector, and real servers end to end (daphne and uvicorn).
SMOKE = [
    "tests/store/test_store.py",
    "tests/live/test_snapshots.py",
    "tests/live/test_diffs.py",
    "tests/live/test_crash_frames.py",
    "tests/core/test_views.py",
    "tests/core/test_templatetags.py",
    "tests/core/test_relations.py",
    "tests/core/test_json_nesting.py",
    "tests/core/test_fetch_modes.py",
    "tests/core/test_migrations_current.py",
    "tests/feed/test_feed_views.py",
    "tests/load/test_uvicorn.py",
    "tests/load/test_multiprocess.py::test_protocol_through_a_real_server",
]

# uv (the dev extra installs it next to nox) installs a pair's packages in seconds once its
# cache is warm, where pip takes minutes; plain venv + pip where uv is missing.
nox.options.default_venv_backend = "uv|venv"
nox.options.error_on_missing_interpreters = True
nox.options.reuse_venv = "yes"
#: `nox` alone (`make matrix`): the smoke of every pair but the default
nox.options.sessions = [f"smoke-{python}-{django}" for python, django in MATRIX[1:]]


def _pyenv_versions() -> None:
    """Make pyenv's installed versions of the matrix's Pythons findable: their shims answer
    (with one global version selected, the others' shims refuse to run), and their bin
    directories come last on PATH where no shim is on it."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for python in sorted({python for python, _ in MATRIX}):
        versions = sorted(
            glob.glob(os.path.join(root, "versions", f"{python}.*")),
            key=lambda path: [int(p) for p in os.path.basename(path).split(".") if p.isdigit()],
        )
        if versions:
            found.append(versions[-1])
    if found:
        os.environ["PYENV_VERSION"] = ":".join(os.path.basename(path) for path in found)
        bins = [os.path.join(path, "bin") for path in found]
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *bins])


_pyenv_versions()
# The interpreters are the machine's (PATH, pyenv): never one downloaded by uv.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


def _install(session: nox.Session, django: str) -> None:
    # One resolve: the dev extra's packages with this Django (and a django-stubs to match).
    # Editable, as `make install` does: a process a test starts outside the checkout (the feed
    # app's probe) imports the tree's code too, not a copy taken when the venv was made.
    session.install("-e", ".[dev]", f"django=={django}.*")
    version = "import django, sys; print('Django', django.get_version(), 'on', sys.version)"
    session.run("python", "-c", version)


def _pytest(session: nox.Session, *args: str) -> None:
    """pytest against a private Redis (tools/redis_server.py starts and stops it)."""
    session.run("python", "-m", "tools.redis_server", "--", "python", "-m", "pytest", *args)


for _python, _django in MATRIX:

    @nox.session(name=f"smoke-{_python}-{_django}", python=_python, tags=["smoke"])
    def smoke(session: nox.Session, django: str = _django) -> None:
        """The smoke of one pair (SMOKE); ``nox -s smoke-3.12-6.1 -- -x`` passes pytest options."""
        _install(session, django)
        # In two processes, a file to each (tests/xdist_redis.py: a Redis of its own for each).
        _pytest(
            session,
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadfile",
            *SMOKE,
            *session.posargs,
        )

    @nox.session(name=f"tests-{_python}-{_django}", python=_python, tags=["full"])
    def tests(session: nox.Session, django: str = _django) -> None:
        """The whole suite and every variant, as `make test` runs them (Makefile's suite)."""
        _install(session, django)
        python = f"PY={session.bin}/python"
        session.run("make", "--no-print-directory", "suite", python, external=True)
