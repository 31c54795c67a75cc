"""The README and the book in docs/: short front page, links that resolve, every setting and check
documented, and a site that builds with ``mkdocs build --strict``. Fast, no network."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from presence.conf import PresenceSettings
from presence.feed.conf import FeedSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def _prose(text: str) -> str:
    """Markdown without code, where link-like text is no link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs) gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def _relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_prose(path.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: git ls-files is unavailable")
    return [name for name in out.decode().split("\0") if name]


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # Before the first section: the title, one short paragraph, then the commands.
    front = text.split("\n## ", 1)[0]
    first_block = FENCE.search(front)
    assert first_block, "the README must open with a code block of its commands"
    assert "make demo" in first_block.group(0)
    assert "make test" in first_block.group(0)
    before = front[: first_block.start()]
    assert before.startswith("# ")
    assert len([p for p in before.split("\n\n") if p.strip()]) <= 2  # title + one paragraph


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        missing = not resolved.exists() or ROOT not in resolved.parents
        if missing or (anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_book_has_its_pages() -> None:
    names = {page.name for page in PAGES}
    for needed in [
        "index.md",
        "getting-started.md",
        "settings.md",
        "privacy.md",
        "api.md",
        "template-tags.md",
        "websocket.md",
        "js-client.md",
        "http.md",
        "feed.md",
        "commands.md",
        "redis-layout.md",
        "architecture.md",
        "deployment.md",
        "performance.md",
        "checks.md",
        "changelog.md",
    ]:
        assert needed in names
    nav = (ROOT / "mkdocs.yml").read_text()
    assert not [name for name in names if name not in nav], "every page is in the nav"


def test_no_file_points_to_the_private_contract() -> None:
    # Built from parts, so that this file does not name them itself.
    private = ["CONTRACT" + ".md", "../" + "shared"]
    offenders = []
    for name in _tracked_files():
        path = ROOT / name
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # images
            continue
        offenders += [f"{name}: {word}" for word in private if word.lower() in text.lower()]
    assert not offenders


@pytest.mark.parametrize("settings_class", [PresenceSettings, FeedSettings])
def test_every_setting_is_documented(settings_class: type) -> None:
    text = (DOCS / "settings.md").read_text()
    missing = [f.name for f in dataclasses.fields(settings_class) if f"`{f.name}`" not in text]
    assert not missing


@pytest.mark.parametrize(
    ("checks", "pattern"),
    [
        (ROOT / "presence" / "checks", r"presence\.[EW]\d{3}"),
        (ROOT / "presence" / "feed" / "checks.py", r"presence_feed\.[EW]\d{3}"),
    ],
)
def test_every_system_check_is_documented(checks: Path, pattern: str) -> None:
    sources = sorted(checks.glob("*.py")) if checks.is_dir() else [checks]
    ids = set(re.findall(pattern, "".join(source.read_text() for source in sources)))
    assert ids
    text = (DOCS / "checks.md").read_text()
    assert not sorted(check for check in ids if f"`{check}`" not in text)


def test_the_book_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (make install does)")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"),
            *("--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "websocket" / "index.html").exists()


def test_the_readmes_asgi_py_imports_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """The README's asgi.py, exactly as printed, works as a site's asgi.py: imported by a fresh
    interpreter (as an ASGI server does), it sets Django up before importing presence."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(# asgi\.py.*?)```", readme, re.S)
    assert len(blocks) == 1, "the README has one complete asgi.py block"
    (tmp_path / "asgi_as_printed.py").write_text(blocks[0])
    probe = (
        "import asgi_as_printed as m, channels.routing as r;"
        "assert isinstance(m.application, r.ProtocolTypeRouter);"
        "print(sorted(m.application.application_mapping))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings.base"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['http', 'websocket']"


def test_the_changelog_is_one_text() -> None:
    """CHANGELOG.md (shipped in the sdist, shown by package indexes) is the one text: the book's
    page is a symlink to it. It is read from the repository root and from docs/, so it has no
    relative link (one would resolve in only one of the two places)."""
    page = DOCS / "changelog.md"
    assert page.is_symlink(), "docs/changelog.md is a symlink to ../CHANGELOG.md, not a copy"
    assert os.readlink(page) == "../CHANGELOG.md"
    assert page.resolve() == (ROOT / "CHANGELOG.md").resolve()
    assert page.read_text().startswith("# Changelog\n")
    assert not _relative_links(ROOT / "CHANGELOG.md")


def test_the_book_links_nothing_outside_docs() -> None:
    """mkdocs --strict fails on a link out of docs/; the repository's files outside it (such as
    benchmarks/RESULTS.md) are named in plain text."""
    outside = {
        page.name: [t for t in _relative_links(page) if t.split("#")[0].startswith("../")]
        for page in PAGES
    }
    assert not {name: links for name, links in outside.items() if links}


def test_the_version_is_defined_in_one_place() -> None:
    from importlib.metadata import version

    import presence

    assert version("django-live-presence") == presence.__version__
    assert "version = " not in (ROOT / "pyproject.toml").read_text().split("[tool.")[0]
