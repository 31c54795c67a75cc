"""The settings page's per-person exceptions ("always share with" / "never share with"): one
form per listed person, with a choice for each of the three settings. Only the people a page
listed are posted, so a save changes only them; new exceptions are for contacts only, and an
exception for someone who is no longer a contact can be kept or removed, not changed."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.http import QueryDict
from django.utils.translation import gettext_lazy as _

from presence import api
from presence.domain import VISIBILITY_SETTINGS
from presence.pages.people import ALWAYS, NEVER, SHOWN_MAX, Person, named
from presence.users import parse_user_id, pk_kind

PREFIX = "share"
CHOICES = [
    ("", _("As set above")),
    (ALWAYS, _("Always share")),
    (NEVER, _("Never share")),
]
SETTING_LABELS = {
    "online_visibility": _("When I am online"),
    "last_seen_visibility": _("My last seen"),
    "activity_visibility": _("My status text and emoji"),
}


class ExceptionForm(forms.Form):
    """One person (a hidden id) and the exception of each setting for them."""

    viewer = forms.CharField(widget=forms.HiddenInput, max_length=200)

    def __init__(self, *args: Any, people: dict[str, Person], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.people = people
        for setting in VISIBILITY_SETTINGS:
            self.fields[setting] = forms.ChoiceField(
                label=SETTING_LABELS[setting], choices=CHOICES, required=False
            )
        raw = self.data.get(self.add_prefix("viewer")) if self.is_bound else None
        if raw is None:
            raw = self.initial.get("viewer")
        #: who this form is about (None: an id the page may not list), for the template
        self.person = self._person(raw)

    def _person(self, raw: Any) -> Person | None:
        key = _canonical(raw)
        return None if key is None else self.people.get(key)

    def clean_viewer(self) -> Person:
        person = self._person(self.cleaned_data["viewer"])
        if person is None:
            raise forms.ValidationError(
                _("This person is not one of your contacts."), code="not_a_contact"
            )
        return person

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        person = data.get("viewer")
        if isinstance(person, Person) and not person.is_contact:
            for setting in VISIBILITY_SETTINGS:
                wanted = data.get(setting)
                if wanted and wanted != person.current.get(setting):
                    self.add_error(
                        setting,
                        _(
                            "%(name)s is not one of your contacts: add them to your contacts "
                            "first, or remove this exception."
                        )
                        % {"name": person.name},
                    )
        return data


def _canonical(raw: Any) -> str | None:
    """The id as ``Person.key`` spells it, or None when it cannot be a user id."""
    if not isinstance(raw, str):
        return None
    try:
        return str(parse_user_id(raw, pk_kind()))
    except ValueError:
        return None


class BaseExceptionFormSet(forms.BaseFormSet):
    def __init__(
        self,
        data: QueryDict | None = None,
        *,
        people: dict[str, Person],
        initial: list[dict[str, Any]] | None = None,
    ) -> None:
        self.people = people
        super().__init__(data, initial=initial, prefix=PREFIX, form_kwargs={"people": people})

    def clean(self) -> None:
        seen: set[str] = set()
        for form in self.forms:
            person = form.cleaned_data.get("viewer") if hasattr(form, "cleaned_data") else None
            if not isinstance(person, Person):
                continue
            if person.key in seen:
                raise forms.ValidationError(
                    _("%(name)s is listed twice.") % {"name": person.name}, code="duplicate"
                )
            seen.add(person.key)

    def save_exceptions(self, owner: Any) -> int:
        """Write the exceptions that differ from the stored ones, through ``api.share_with``
        and ``api.unshare`` (open sockets are told); the number written."""
        written = 0
        for form in self.forms:
            person = form.cleaned_data.get("viewer")
            if not isinstance(person, Person):
                continue  # an extra form left empty
            for setting in VISIBILITY_SETTINGS:
                wanted = form.cleaned_data[setting]
                if wanted == person.current.get(setting, ""):
                    continue
                if wanted:
                    api.share_with(owner, person.pk, setting, allow=wanted == ALWAYS)
                else:
                    api.unshare(owner, person.pk, setting)
                written += 1
        return written


ExceptionFormSet = cast(
    type[BaseExceptionFormSet],
    forms.formset_factory(
        ExceptionForm,
        formset=BaseExceptionFormSet,
        extra=0,
        max_num=SHOWN_MAX,
        absolute_max=SHOWN_MAX,
        validate_max=True,
    ),
)


def listing(people: list[Person]) -> BaseExceptionFormSet:
    """The unbound formset listing ``people`` with their current exceptions."""
    initial = [
        {"viewer": person.key, **{s: person.current.get(s, "") for s in VISIBILITY_SETTINGS}}
        for person in people
    ]
    return ExceptionFormSet(initial=initial, people={p.key: p for p in people})


def posted(owner: Any, data: QueryDict) -> BaseExceptionFormSet:
    """The formset bound to a POST: the people it names are looked up (only those the page may
    list for ``owner``; any other id is an error of its form). Unbound and empty when the POST
    has no formset at all (a site's template left the exceptions out): they stay as they are."""
    if not any(key.startswith(f"{PREFIX}-") for key in data):
        return ExceptionFormSet(people={})
    raw_ids = [
        value
        for key, value in data.items()
        if key.startswith(f"{PREFIX}-") and key.endswith("-viewer") and isinstance(value, str)
    ][: SHOWN_MAX + 1]
    return ExceptionFormSet(data, people=named(owner, raw_ids))
