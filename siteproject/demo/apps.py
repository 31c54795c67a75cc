from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo social site: pages and ``seed_demo``. No models of its own."""

    name = "siteproject.demo"
    label = "demo"
    verbose_name = "Presence demo"
