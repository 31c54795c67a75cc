"""Ready HTML pages a site links to: the privacy and status settings page
(``presence:settings``, :mod:`presence.pages.views`). Templates in ``presence/`` that a site
overrides (docs/privacy.md, "The ready settings page")."""
