"""The shipped translations are complete and compiled: every message of every catalog is
translated and none is fuzzy, and each .mo holds exactly what its .po says (`make messages`)."""

from __future__ import annotations

import ast
import gettext
from pathlib import Path

import pytest

LOCALE = Path(__file__).resolve().parent.parent / "presence" / "locale"
CATALOGS = sorted(LOCALE.glob("*/LC_MESSAGES/django.po"))


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


def test_there_are_catalogs() -> None:
    assert {path.parts[-3] for path in CATALOGS} >= {"ja", "zh_Hans", "vi"}


@pytest.mark.parametrize("po", CATALOGS, ids=lambda path: path.parts[-3])
def test_every_message_is_translated_and_none_is_fuzzy(po: Path) -> None:
    entries, fuzzy = parse_po(po)
    assert entries
    assert fuzzy == []
    untranslated = [key for key, texts in entries.items() if not all(texts)]
    assert untranslated == []


@pytest.mark.parametrize("po", CATALOGS, ids=lambda path: path.parts[-3])
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
