"""Build the release (sdist and wheel), check its metadata, install the wheel into a clean
virtualenv outside the checkout, and drive a minimal site with it: migrate, check, a page view
recorded in Redis, a WebSocket subscribe answered. A file missing from the wheel (a Lua script,
a static file, a migration, a translation) fails here, not on a user's site.

    python -m tools.redis_server -- python -m tools.wheel_smoke     # (make release-check)

Needs REDIS_URL (a Redis whose database 0 the smoke test may write to) and the network access
pip needs for the dependencies. Everything it creates lives in one temporary directory, removed
at the end, also on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
import os
SECRET_KEY = "smoke-test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
    "django.contrib.staticfiles", "channels", "presence", "presence.feed",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "presence.middleware.PresenceMiddleware",
]
ROOT_URLCONF = "smokesite.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
    "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.path.join(os.path.dirname(__file__), "db.sqlite3")}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
          "presence": {"BACKEND": "django_redis.cache.RedisCache",
                       "LOCATION": os.environ["REDIS_URL"]}}
PRESENCE = {"CACHE_ALIAS": "presence", "KEY_PREFIX": "presence-smoke"}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                              "CONFIG": {"hosts": [os.environ["REDIS_URL"]],
                                         "prefix": "presence-smoke"}}}
STATIC_URL = "/static/"
USE_TZ = True
"""

URLS = """
from django.urls import include, path
from django.views.generic import TemplateView

urlpatterns = [
    path("", TemplateView.as_view(template_name="page.html")),
    path("presence/", include("presence.urls")),
    path("presence/", include("presence.feed.urls")),
]
"""

PAGE = """{% load presence presence_feed %}<!doctype html>
<title>smoke</title>{% presence_css %}{% presence_dot request.user %}{% presence_script %}
"""

DRIVE = """
import asyncio, json, pathlib, sys
import django
django.setup()

from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client

import presence
from presence import api
from presence.routing import websocket_urlpatterns
from presence.store import scripts

venv = pathlib.Path(sys.prefix).resolve()
where = pathlib.Path(presence.__file__).resolve()
assert venv in where.parents, f"presence imported from {where}, not from the installed wheel"
for name in ("presence/presence.js", "presence/presence.css"):
    assert finders.find(name), f"{name} is missing from the wheel"
assert len(scripts.ALL) >= 6

User = get_user_model()
ann = User.objects.create_user("ann", password="pw")
ben = User.objects.create_user("ben", password="pw")
api.follow(ann, ben)

client = Client()
client.force_login(ann)
page = client.get("/")
assert page.status_code == 200, page.status_code
assert b'class="presence-dot presence-dot--online"' in page.content, page.content[:300]
assert b"presence/presence.css" in page.content and b"presence/presence.js" in page.content
assert api.get_presence(ann, ben).status == "online", "the page view was not recorded"


async def subscribe():
    async def as_ben(scope, receive, send):
        scope = {**scope, "user": ben}
        return await URLRouter(websocket_urlpatterns)(scope, receive, send)

    socket = WebsocketCommunicator(as_ben, "/ws/presence/")
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"type": "subscribe", "users": [ann.pk]})
    reply = await socket.receive_json_from(timeout=5)
    await socket.disconnect()
    return reply


reply = asyncio.run(subscribe())
assert reply["type"] == "presence_state", reply
assert reply["presences"][str(ann.pk)]["status"] == "online", reply
print(f"wheel smoke test passed: presence {presence.__version__} from {where.parent}")
"""


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("$", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], cwd=cwd, env=env, check=True, timeout=900)


def main() -> int:
    if not os.environ.get("REDIS_URL"):
        print("REDIS_URL is not set: run through `python -m tools.redis_server --`.")
        return 2
    with tempfile.TemporaryDirectory(prefix="presence-release-") as tmp:
        work = Path(tmp)
        dist = work / "dist"
        run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
        artifacts = sorted(dist.iterdir())
        assert sorted(p.suffix for p in artifacts) == [".gz", ".whl"], artifacts
        run(sys.executable, "-m", "twine", "check", "--strict", *artifacts)
        wheel = next(p for p in artifacts if p.suffix == ".whl")

        venv = work / "venv"
        run(sys.executable, "-m", "venv", venv)
        python = venv / "bin" / "python"
        run(python, "-m", "pip", "install", "--quiet", f"{wheel}[daphne]")

        site = work / "site"
        (site / "smokesite" / "templates").mkdir(parents=True)
        (site / "smokesite" / "__init__.py").write_text("")
        (site / "smokesite" / "settings.py").write_text(textwrap.dedent(SETTINGS))
        (site / "smokesite" / "urls.py").write_text(textwrap.dedent(URLS))
        (site / "smokesite" / "templates" / "page.html").write_text(PAGE)
        (site / "drive.py").write_text(textwrap.dedent(DRIVE))
        # Only the site and the virtualenv: the checkout must not be importable.
        env = {
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "PYTHONPATH": str(site),
            "DJANGO_SETTINGS_MODULE": "smokesite.settings",
            "REDIS_URL": os.environ["REDIS_URL"],
        }
        run(venv / "bin" / "django-admin", "migrate", "--noinput", cwd=site, env=env)
        run(venv / "bin" / "django-admin", "check", "--fail-level", "WARNING", cwd=site, env=env)
        run(python, "drive.py", cwd=site, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
