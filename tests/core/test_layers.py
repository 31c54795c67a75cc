"""The package's layering (docs/architecture.md), enforced by import-linter's contracts in
pyproject.toml: a lower layer never imports a higher one, and the feed app uses only the core's
public modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: parts of the package that are data or Django plumbing, not layers
NOT_LAYERS = {"__init__", "migrations", "locale", "static", "templates", "py"}


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["contracts"])


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"lint-imports not found next to {sys.executable}: run `make install`.")
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_its_layers() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_every_module_of_the_package_has_a_layer() -> None:
    (layers,) = [
        c["layers"] for c in _contracts() if c["type"] == "layers" and "containers" not in c
    ]
    named = {
        module.strip().removeprefix("presence.")
        for line in layers  # type: ignore[attr-defined]
        for module in line.split("|")
    }
    package = ROOT / "presence"
    modules = {path.stem for path in package.glob("*.py")} | {
        path.name for path in package.iterdir() if path.is_dir() and path.name != "__pycache__"
    }
    unplaced = sorted(modules - named - NOT_LAYERS)
    assert not unplaced, f"place these modules in pyproject.toml's layers: {unplaced}"


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # the pure domain reaching up to the hub
        ("domain/resolver.py", "from presence import hub  # noqa\n"),
        # the announcer importing the hub again (the cycle it was split to break)
        ("announce.py", "from presence.hub import Hub  # noqa\n"),
        # the feed reaching into the store directly
        ("feed/api/posting.py", "from presence import store as _store  # noqa\n"),
    ],
)
def test_a_violation_is_caught(tmp_path: Path, module: str, line: str) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "presence", copy / "presence", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "presence" / module
    source = target.read_text()
    marker = "from __future__ import annotations\n"
    target.write_text(source.replace(marker, marker + line, 1))
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
