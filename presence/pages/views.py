"""``presence:settings``: the ready page where a signed-in user sets their privacy levels,
status (automatic, do not disturb, invisible) with a custom text and emoji, and per-person
exceptions. Anonymous visitors are sent to ``LOGIN_URL``; a POST needs a CSRF token and counts
one write against ``HTTP_RATE_LIMIT``; bad input is shown on the form and nothing is saved.

The status menu (``{% presence_status_menu %}``) posts its status fields here without
JavaScript, with ``next``: the page it was on, where a save goes back to."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.apps import apps
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import redirect, render
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_http_methods

from presence import domain, ratelimit
from presence.domain import VISIBILITY_SETTINGS, InvalidInput
from presence.models import PrivacySettings
from presence.pages import people, sharing
from presence.pages.forms import LevelsForm, StatusForm

TEMPLATE = "presence/settings.html"


class SearchForm(forms.Form):
    """The ``?q=`` that narrows the people listed (without JavaScript; with it, the list is
    filtered as one types)."""

    q = forms.CharField(label=gettext_lazy("Find a contact"), required=False, max_length=100)

    def clean_q(self) -> str:
        try:
            return domain.check_text(self.cleaned_data["q"], "q")
        except InvalidInput as error:
            raise forms.ValidationError(error.message) from None

    @property
    def query(self) -> str:
        return self.cleaned_data.get("q", "") if self.is_valid() else ""


def _own_levels(user: Any, data: Any = None) -> LevelsForm:
    # No row until the user changes a level: a missing row means the site's defaults.
    row = PrivacySettings.objects.filter(user=user).first() or PrivacySettings(user=user)
    return LevelsForm(data, instance=row)


def _part(data: QueryDict, names: Iterable[str]) -> QueryDict | None:
    """``data`` for a part of the page, if the POST has any of its fields; else None (the part
    is left as it is: a site's template may leave a part out)."""
    return data if any(name in data for name in names) else None


def _next_of(request: HttpRequest) -> str | None:
    """The ``next`` posted (the page of the status menu that posted), if it is on this site:
    another host's, or another scheme's, would make the page an open redirect."""
    target = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return target if target and safe else None


def _save(user: Any, levels: LevelsForm, status: StatusForm, shares: Any) -> bool:
    """Save the parts posted, all or nothing: the status first (the one step that may still
    refuse, e.g. a clearing time that passed meanwhile). False, with the error on the form, if
    refused."""
    try:
        with transaction.atomic():
            if status.is_bound:
                status.save_status()
            if levels.is_bound:
                levels.save_levels()
            if shares.is_bound:
                shares.save_exceptions(user)
    except InvalidInput as error:
        status.add_error(None, error.message)
        return False
    return True


@csrf_protect
@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def settings_view(request: HttpRequest) -> HttpResponse:
    user = request.user
    search = SearchForm(request.GET)
    limited: str | None = None
    wait: int | None = None
    back: str | None = None
    if request.method == "POST":
        back = _next_of(request)
        levels = _own_levels(user, _part(request.POST, VISIBILITY_SETTINGS))
        status = StatusForm(_part(request.POST, StatusForm.base_fields), user=user)
        shares = sharing.posted(user, request.POST)
        parts = [form for form in (levels, status, shares) if form.is_bound]
        wait = ratelimit.retry_after(user)
        if wait is not None:
            limited = ratelimit.limited_message(wait)
        elif all([form.is_valid() for form in parts]) and _save(user, levels, status, shares):
            if apps.is_installed("django.contrib.messages"):
                from django.contrib import messages

                # fail_silently: a site may install the app without its middleware
                messages.success(request, _("Your settings are saved."), fail_silently=True)
            if back is not None:
                return HttpResponseRedirect(back)
            query = f"?{urlencode({'q': search.query})}" if search.query else ""
            return redirect(request.path + query)
        listed, total = [form.person for form in shares.forms if form.person], len(shares.forms)
    else:
        levels = _own_levels(user)
        status = StatusForm(user=user)
        listed, total = people.listed(user, search.query)
        shares = sharing.listing(listed)
    context = {
        "levels": levels,
        "status": status,
        "sharing": shares,
        "search": search,
        "shown": len(listed),
        "total": total,
        "limited": limited,
        "has_errors": request.method == "POST" and limited is None,
        # posted again with the corrected form, so that its save still goes back there
        "next": back,
    }
    response = render(request, TEMPLATE, context, status=200 if wait is None else 429)
    if wait is not None:
        response["Retry-After"] = str(wait)
    add_never_cache_headers(response)
    return response
