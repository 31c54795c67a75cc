"""The shipped translations are complete and compiled: every message of every catalog is
translated and none is fuzzy, and each .mo holds exactly what its .po says (`make messages`).
Both presence's catalogs (presence/locale) and the demo's (siteproject/demo/locale) are checked,
and the demo's pages use the demo's."""

from __future__ import annotations

import ast
import gettext
import shutil
from pathlib import Path

import django
import pytest
from django.apps import apps
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

ROOT = Path(__file__).resolve().parents[2]
LOCALES = {
    "presence": ROOT / "presence" / "locale",
    "demo": ROOT / "siteproject" / "demo" / "locale",
}
CATALOGS = [
    path for locale in LOCALES.values() for path in sorted(locale.glob("*/LC_MESSAGES/django.po"))
]


def catalog_id(path: Path) -> str:
    """Which locale directory and language: presence-ja, demo-vi."""
    name = next(name for name, locale in LOCALES.items() if path.is_relative_to(locale))
    return f"{name}-{path.parts[-3]}"


def _string(lines: list[str]) -> str:
    return "".join(ast.literal_eval(line) for line in lines)


def parse_po(path: Path) -> tuple[dict[str, list[str] | tuple[str, ...]], list[str]]:
    """{key: translations} (key as in a compiled catalog: "ctxt\\x04id", plurals by their
    singular id, their translations as a tuple) and the keys marked fuzzy; the header entry is
    left out."""
    entries: dict[str, list[str] | tuple[str, ...]] = {}
    fuzzy: list[str] = []
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    for block in blocks:
        lines = [line for line in block.splitlines() if line and not line.startswith("#~")]
        flags = " ".join(line for line in lines if line.startswith("#,"))
        fields: dict[str, list[str]] = {}
        current: str | None = None
        for line in lines:
            if line.startswith("#"):
                continue
            if line.startswith('"'):
                assert current is not None
                fields[current].append(line)
                continue
            name, _, rest = line.partition(" ")
            current = name
            fields[current] = [rest]
        if "msgid" not in fields:
            continue
        msgid = _string(fields["msgid"])
        if not msgid:
            continue  # the header
        key = msgid
        if "msgctxt" in fields:
            key = _string(fields["msgctxt"]) + "\x04" + msgid
        if "msgid_plural" in fields:
            entries[key] = tuple(
                _string(fields[name]) for name in sorted(fields) if name.startswith("msgstr[")
            )
        else:
            entries[key] = [_string(fields["msgstr"])]
        if "fuzzy" in flags:
            fuzzy.append(key)
    return entries, fuzzy


@pytest.mark.parametrize("locale", LOCALES.values(), ids=LOCALES.keys())
def test_there_are_catalogs(locale: Path) -> None:
    found = {path.parts[-3] for path in locale.glob("*/LC_MESSAGES/django.po")}
    assert found >= {"ja", "zh_Hans", "vi"}


@pytest.mark.parametrize("po", CATALOGS, ids=catalog_id)
def test_every_message_is_translated_and_none_is_fuzzy(po: Path) -> None:
    entries, fuzzy = parse_po(po)
    assert entries
    assert fuzzy == []
    untranslated = [key for key, texts in entries.items() if not all(texts)]
    assert untranslated == []


@pytest.mark.parametrize("po", CATALOGS, ids=catalog_id)
def test_the_compiled_catalog_matches_its_source(po: Path) -> None:
    entries, _ = parse_po(po)
    with po.with_suffix(".mo").open("rb") as mo:
        compiled = gettext.GNUTranslations(mo)
    catalog = compiled._catalog  # type: ignore[attr-defined]
    for key, texts in entries.items():
        if isinstance(texts, list):
            assert catalog.get(key) == texts[0], key
        else:
            assert tuple(catalog.get((key, n)) for n in range(len(texts))) == texts, key
    assert len({k if isinstance(k, str) else k[0] for k in catalog if k}) == len(entries)


def test_every_message_of_the_code_is_in_presences_catalogs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """makemessages, run on a copy of the package as `make messages` runs it, finds no message
    the shipped catalogs lack (a new string left untranslated in every language)."""
    if shutil.which("xgettext") is None:
        pytest.skip("GNU gettext's xgettext is not installed (Debian: gettext)")
    copy = tmp_path / "presence"
    shutil.copytree(ROOT / "presence", copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    monkeypatch.chdir(copy)
    languages = sorted(path.parts[-2] for path in (copy / "locale").glob("*/LC_MESSAGES"))
    call_command("makemessages", locale=languages, no_obsolete=True, no_location=True, verbosity=0)
    for language in languages:
        found = parse_po(copy / "locale" / language / "LC_MESSAGES" / "django.po")[0]
        shipped = parse_po(LOCALES["presence"] / language / "LC_MESSAGES" / "django.po")[0]
        assert sorted(set(found) - set(shipped)) == [], f"run `make messages` ({language})"


@pytest.mark.parametrize("language", ["ja", "zh_Hans", "vi"])
def test_the_demo_catalog_agrees_with_the_catalogs_it_overrides(language: str) -> None:
    """The demo's catalog is in LOCALE_PATHS, which win over the apps' catalogs: where it shares a
    message with presence's or Django's, it translates it as they do, so it changes no page but
    the demo's own strings (the admin's "Go" and "Save" stay the admin's)."""
    demo, _ = parse_po(LOCALES["demo"] / language / "LC_MESSAGES" / "django.po")
    others = [Path(django.__file__).parent / "conf" / "locale"] + [
        Path(app.path) / "locale"
        for app in apps.get_app_configs()
        if app.name != "siteproject.demo"
    ]
    shared = 0
    for locale in others:
        mo = locale / language / "LC_MESSAGES" / "django.mo"
        if not mo.exists():
            continue
        with mo.open("rb") as file:
            catalog = gettext.GNUTranslations(file)._catalog  # type: ignore[attr-defined]
        for key, texts in demo.items():
            theirs = catalog.get(key if isinstance(texts, list) else (key, 0))
            if theirs is not None:
                shared += 1
                assert theirs == texts[0], (str(locale), key)
    assert shared  # "Do not disturb" (presence), "Log out" (the admin), ...


@pytest.mark.django_db
def test_a_demo_page_speaks_the_demo_catalog(client: Client) -> None:
    """The login page asked for in Japanese shows the demo's own strings in Japanese, strings
    that presence's catalog does not have (so they can only come from the demo's)."""
    presence_ja, _ = parse_po(LOCALES["presence"] / "ja" / "LC_MESSAGES" / "django.po")
    demo_ja, _ = parse_po(LOCALES["demo"] / "ja" / "LC_MESSAGES" / "django.po")
    heading = "See who's around."
    assert heading not in presence_ja
    assert demo_ja[heading] == ["誰がいるか見てみましょう。"]

    response = client.get(reverse("demo:login"), headers={"accept-language": "ja"})

    assert response.status_code == 200
    html = response.content.decode()
    assert '<html lang="ja"' in html
    assert "<h1>誰がいるか見てみましょう。</h1>" in html
    assert "デモユーザー" in html
    assert "See who&#x27;s around." not in html and "See who's around." not in html
