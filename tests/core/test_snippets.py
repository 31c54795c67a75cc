"""The README's and the book's snippets, run as printed (issue 29): the settings snippet pasted
into a settings module with no CACHES, or with some; the user admin snippet on an admin site
with the user model registered, or never registered (a custom user model)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import global_settings
from django.contrib import admin
from django.contrib.admin import sites
from django.contrib.auth import get_user_model
from django.core.checks.caches import check_default_cache_is_configured
from django.test.utils import override_settings

from presence import api
from presence.admin import PresenceUserAdminMixin
from presence.checks import check_cache
from presence.conf import get_settings
from presence.store import reset_clients

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
PRINTED_URL = "redis://127.0.0.1:6379/0"


def settings_snippet(page: Path) -> str:
    """The settings part of the page's "# settings.py" block (up to its "# urls.py" part)."""
    blocks = re.findall(r"```python\n(# settings\.py\n.*?)```", page.read_text(), re.S)
    assert len(blocks) == 1, f"{page.name} has one settings.py block"
    return blocks[0].split("\n# urls.py", 1)[0]


def paste(page: Path, module: dict[str, Any]) -> dict[str, Any]:
    """Run the snippet at the end of a settings module whose names are ``module``."""
    namespace = {"__name__": "mysite.settings", **module}
    exec(compile(settings_snippet(page), f"<{page.name}>", "exec"), namespace)
    return namespace


#: what `startproject` writes, and no CACHES
STARTPROJECT = {
    "INSTALLED_APPS": ["django.contrib.admin", "django.contrib.auth"],
    "MIDDLEWARE": ["django.contrib.auth.middleware.AuthenticationMiddleware"],
}
PAGES = [README, GETTING_STARTED]


def test_the_readme_and_the_book_print_the_same_settings() -> None:
    assert settings_snippet(README) == settings_snippet(GETTING_STARTED)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_settings_snippet_works_in_a_settings_module_without_caches(page: Path) -> None:
    assert "CACHES" not in STARTPROJECT
    site = paste(page, STARTPROJECT)
    caches = site["CACHES"]
    # Django's default cache, as the site had it (implicitly), and presence's alias.
    assert caches == {
        "default": global_settings.CACHES["default"],
        "presence": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": PRINTED_URL},
    }
    assert site["PRESENCE"] == {"CACHE_ALIAS": "presence"}
    with override_settings(CACHES=caches, PRESENCE=site["PRESENCE"]):
        get_settings.cache_clear()
        assert check_default_cache_is_configured(None) == []
        assert check_cache() == []
    get_settings.cache_clear()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_settings_snippet_keeps_the_sites_own_caches(page: Path) -> None:
    own = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://db:6379/1"},
        "sessions": {"BACKEND": "django.core.cache.backends.db.DatabaseCache"},
    }
    site = paste(page, {**STARTPROJECT, "CACHES": own})
    assert site["CACHES"] == {
        **own,
        "presence": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": PRINTED_URL},
    }


@pytest.mark.django_db
def test_presence_runs_on_the_caches_the_snippet_made(
    make_user: Any, redis_url: str, settings: Any
) -> None:
    """The snippet's CACHES and PRESENCE, on the test Redis instead of the printed URL."""
    site = paste(README, STARTPROJECT)
    caches = {
        alias: {**conf, "LOCATION": redis_url} if alias == "presence" else conf
        for alias, conf in site["CACHES"].items()
    }
    settings.CACHES = caches
    settings.PRESENCE = {**settings.PRESENCE, **site["PRESENCE"]}
    get_settings.cache_clear()
    reset_clients()
    assert get_settings().CACHE_ALIAS == "presence"
    ann = make_user()
    api.touch(ann)
    assert api.get_presence(ann, ann).status == "online"


# --- the user admin snippet ----------------------------------------------------------------


def admin_snippet() -> str:
    blocks = re.findall(
        r"```python\n(# myapp/admin\.py\n.*?)```", GETTING_STARTED.read_text(), re.S
    )
    assert len(blocks) == 1, "getting-started.md has one myapp/admin.py block"
    return blocks[0]


@pytest.mark.parametrize("registered", [False, True], ids=["never-registered", "registered"])
def test_the_admin_snippet_on_a_site_with_or_without_a_user_admin(
    registered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as printed, against an admin site of its own (``admin.site`` and the default site
    ``@admin.register`` uses, both this one)."""
    user_model = get_user_model()
    site = sites.AdminSite(name="snippet")
    if registered:
        site.register(user_model)
    monkeypatch.setattr(admin, "site", site)
    monkeypatch.setattr(sites, "site", site)
    exec(compile(admin_snippet(), "<getting-started.md>", "exec"), {"__name__": "myapp.admin"})
    assert site.is_registered(user_model)
    model_admin = site.get_model_admin(user_model)
    assert isinstance(model_admin, PresenceUserAdminMixin)
    assert type(model_admin).__name__ == "SiteUserAdmin"


def test_the_demo_admin_copies_the_guarded_snippet() -> None:
    demo = (ROOT / "siteproject" / "demo" / "admin.py").read_text()
    assert "if admin.site.is_registered(User):\n    admin.site.unregister(User)" in demo
    assert "if admin.site.is_registered(User):\n    admin.site.unregister(User)" in admin_snippet()
