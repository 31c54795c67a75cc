"""The tests of one site each (tests/sites/test_<site>*.py): a module is collected only where its
site's app is installed, so that every settings variant of `make test` may collect the whole of
tests/ and select its tests by marker (pyproject.toml) without importing a site it does not run."""

from __future__ import annotations

from pathlib import Path

import pytest

#: the site a module here tests (the first word of its name after ``test_``) and its app
SITE_APPS = {
    "demo": "siteproject.demo",
    "emailsite": "tests.sites.emailsite",
    "uuidsite": "tests.sites.uuidsite",
    "hnsite": "tests.sites.hnsite",
    "forumsite": "tests.sites.forumsite",
}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    site = collection_path.stem.removeprefix("test_").split("_")[0]
    if collection_path.suffix != ".py" or site not in SITE_APPS:
        return None
    from django.conf import settings

    return SITE_APPS[site] not in settings.INSTALLED_APPS or None
