"""Pages of the demo social site.

Presence is only ever read through ``presence.api`` and the template tags; relations (follow,
close friend, block) are plain rows in presence's models, and privacy is computed on read, so
changing them needs no further call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from presence import api, ratelimit
from presence.domain import InvalidInput, check_text
from presence.models import Block, Contact
from siteproject.demo import seed

User = get_user_model()


def member_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # An explicit login URL keeps the demo working wherever its urls are included.
    return login_required(view, login_url="demo:login")


class LoginView(auth_views.LoginView):
    template_name = "demo/login.html"
    redirect_authenticated_user = True
    next_page = "demo:home"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return super().get_context_data(
            demo_users=list(seed.DEMO_USERS), demo_password=seed.DEMO_PASSWORD, **kwargs
        )


def friends_of(user: Any) -> QuerySet[Any]:
    """Mutual contacts: ``user`` follows them and they follow ``user``."""
    return User._default_manager.filter(
        presence_followers__owner=user, presence_contacts__contact=user
    ).order_by("first_name", "username")


def with_relations(queryset: QuerySet[Any], me: Any) -> QuerySet[Any]:
    """How each user relates to ``me``, in the same query."""
    them = OuterRef("pk")
    return queryset.annotate(
        i_follow=Exists(Contact.objects.filter(owner=me, contact=them)),
        follows_me=Exists(Contact.objects.filter(owner=them, contact=me)),
        close_friend=Exists(Contact.objects.filter(owner=me, contact=them, close_friend=True)),
        i_blocked=Exists(Block.objects.filter(blocker=me, blocked=them)),
    )


@member_view
def home(request: HttpRequest) -> HttpResponse:
    me = request.user
    friends = list(friends_of(me))
    # People who follow me that I do not follow (back) yet, except those I blocked.
    followers = list(
        User._default_manager.filter(presence_contacts__contact=me)
        .exclude(presence_followers__owner=me)
        .exclude(presence_blocked_by__blocker=me)
        .order_by("first_name", "username")
    )
    return render(
        request,
        "demo/home.html",
        {
            "friends": friends,
            "followers": followers,
            "me_presence": api.get_presence(me, me),
            "page_users": [me, *friends, *followers],
        },
    )


def refuse_bad_text(value: str, name: str) -> HttpResponse | None:
    """A 400 page for text presence's one rule refuses (NUL, which PostgreSQL cannot store or
    even compare, surrogates, invisible controls), before it reaches a query; else None."""
    try:
        check_text(value, name)
    except InvalidInput as error:
        return HttpResponseBadRequest(error.message, content_type="text/plain; charset=utf-8")
    return None


@member_view
def people(request: HttpRequest) -> HttpResponse:
    me = request.user
    query = request.GET.get("q", "").strip()
    refused = refuse_bad_text(query, "q")
    if refused is not None:
        return refused
    everyone = User._default_manager.filter(is_active=True).exclude(pk=me.pk)
    if query:
        everyone = everyone.filter(
            Q(username__icontains=query)
            | Q(first_name__icontains=query)
            | Q(last_name__icontains=query)
        )
    everyone = with_relations(everyone, me).order_by("first_name", "username")[:200]
    users = list(everyone)
    return render(
        request,
        "demo/people.html",
        {"people": users, "query": query, "page_users": [me, *users]},
    )


@member_view
def profile(request: HttpRequest, username: str) -> HttpResponse:
    refused = refuse_bad_text(username, "username")
    if refused is not None:
        return refused
    me = request.user
    target = get_object_or_404(with_relations(User._default_manager.all(), me), username=username)
    return render(
        request,
        "demo/profile.html",
        {
            "target": target,
            "is_me": target.pk == me.pk,
            "presence": api.get_presence(target, me),
            "page_users": [me, target],
        },
    )


def _follow(me: Any, target: Any) -> str:
    Contact.objects.get_or_create(owner=me, contact=target)
    return _("You follow %(name)s.")


def _unfollow(me: Any, target: Any) -> str:
    Contact.objects.filter(owner=me, contact=target).delete()
    return _("You no longer follow %(name)s.")


def _close_friend(me: Any, target: Any) -> str:
    # A close friend is a contact marked so: marking follows too.
    Contact.objects.update_or_create(owner=me, contact=target, defaults={"close_friend": True})
    return _("%(name)s is now one of your close friends.")


def _unclose_friend(me: Any, target: Any) -> str:
    # save(), not QuerySet.update(): update() sends no post_save, so open connections of the
    # former close friend would keep showing what only close friends may see.
    contact = Contact.objects.filter(owner=me, contact=target, close_friend=True).first()
    if contact is not None:
        contact.close_friend = False
        contact.save(update_fields=["close_friend"])
    return _("%(name)s is no longer a close friend.")


def _block(me: Any, target: Any) -> str:
    Block.objects.get_or_create(blocker=me, blocked=target)
    return _("You blocked %(name)s. Neither of you sees the other's presence.")


def _unblock(me: Any, target: Any) -> str:
    Block.objects.filter(blocker=me, blocked=target).delete()
    return _("You unblocked %(name)s.")


ACTIONS: dict[str, Callable[[Any, Any], str]] = {
    "follow": _follow,
    "unfollow": _unfollow,
    "close-friend": _close_friend,
    "unclose-friend": _unclose_friend,
    "block": _block,
    "unblock": _unblock,
}


def _back(request: HttpRequest, fallback: str) -> HttpResponse:
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect(fallback)


@member_view
@require_POST
def relation_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    act = ACTIONS.get(action)
    if act is None:
        raise Http404("Unknown action.")
    target = get_object_or_404(User, pk=pk)
    if target.pk == request.user.pk:
        return HttpResponseBadRequest("You cannot do that to yourself.")
    limited = rate_limited_action(request.user)
    if limited is not None:
        return limited
    message = act(request.user, target)
    messages.success(request, message % {"name": target.get_full_name() or target.username})
    return _back(request, "demo:people")


def over_write_limit(user: Any, form: forms.BaseForm, field: str | None = None) -> int | None:
    """Count one form's write against PRESENCE["HTTP_RATE_LIMIT"]: None when allowed, else the
    seconds to wait, which the form's ``field`` (or the form itself) then says."""
    wait = ratelimit.retry_after(user)
    if wait is not None:
        form.add_error(field, ratelimit.limited_message(wait))
    return wait


def rate_limited_page(response: HttpResponse, wait: int) -> HttpResponse:
    """The form page again, answering 429 with Retry-After (PRESENCE["HTTP_RATE_LIMIT"])."""
    response.status_code = 429
    response["Retry-After"] = str(wait)
    return response


def rate_limited_action(user: Any) -> HttpResponse | None:
    """Count one write of a button (follow, block, join, ...; PRESENCE["HTTP_RATE_LIMIT"]):
    None when allowed, else a 429 with Retry-After saying when to try again (there is no form
    page to show it on)."""
    wait = ratelimit.retry_after(user)
    if wait is None:
        return None
    response = HttpResponse(
        ratelimit.limited_message(wait), content_type="text/plain; charset=utf-8"
    )
    return rate_limited_page(response, wait)
