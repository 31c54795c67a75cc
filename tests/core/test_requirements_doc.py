"""What the README and the book say is supported and tested agrees with the package's metadata
and with what CI runs (noxfile.py's MATRIX, issue 27): pip installs Django 6.1 on Python 3.12+,
so the pages say which pairs CI runs and claim no other as tested."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def classified(prefix: str) -> set[str]:
    return {
        c.removeprefix(prefix)
        for c in PROJECT["classifiers"]
        if re.fullmatch(rf"{prefix}\d+\.\d+", c)
    }


def pairs_tested_by_ci() -> set[tuple[str, str]]:
    """(Python, Django) of the cells "tested by CI" in getting-started.md's table."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("## Requirements\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    djangos = [re.search(r"\d+\.\d+", cell).group(0) for cell in header[1:]]  # type: ignore[union-attr]
    pairs = set()
    for row in body:
        pythons = re.findall(r"3\.\d+", row[0])
        for django, cell in zip(djangos, row[1:], strict=True):
            if "tested by CI" in cell:
                pairs |= {(python, django) for python in pythons}
    return pairs


def ci_matrix() -> list[tuple[str, str]]:
    """noxfile.py's MATRIX: the (Python, Django) pairs CI runs, the default pair first."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "MATRIX":
            return [tuple(pair) for pair in ast.literal_eval(node.value)]
    raise AssertionError("noxfile.py has no MATRIX")


def test_the_book_claims_as_tested_only_what_the_classifiers_name() -> None:
    matrix = ci_matrix()
    assert classified("Programming Language :: Python :: ") == {p for p, _ in matrix}
    assert classified("Framework :: Django :: ") == {d for _, d in matrix}
    assert pairs_tested_by_ci() == set(matrix)


def test_the_readme_says_what_ci_tests_and_what_pip_installs() -> None:
    readme = (ROOT / "README.md").read_text()
    requirements = " ".join(readme.split("Requirements:", 1)[1].split("\n\n", 1)[0].split())
    assert "Python 3.11\N{EN DASH}3.13" in requirements
    assert ci_matrix()[0] == ("3.11", "5.2")
    assert "CI runs the whole suite on Python 3.11 with Django 5.2 LTS" in requirements
    assert (
        "a smoke of every other pair: Python 3.12 and 3.13 with Django 5.2 LTS and with Django 6.1"
        in requirements
    )
    # ... which is what the sentence names.
    assert set(ci_matrix()[1:]) == {(p, d) for p in ("3.12", "3.13") for d in ("5.2", "6.1")}
    assert "6.1 on 3.12+" in requirements
    assert PROJECT["requires-python"] == ">=3.11"
    assert "django>=5.2" in PROJECT["dependencies"]
