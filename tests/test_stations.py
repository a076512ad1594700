"""docs/stations.md (and its zh twin) stay true to the code: every function, NumPy twin and test
they name exists, and the tour sections they point at are there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "docs" / "stations.md", ROOT / "docs" / "zh" / "stations.md"]


def _rows(doc: Path) -> list[list[str]]:
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            rows.append(cells)
    return rows


def _defined(path: Path) -> set[str]:
    """Every function and class in a Python file, methods as Class.method."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
    return names


@pytest.mark.parametrize("doc", DOCS, ids=["en", "zh"])
def test_every_station_names_code_and_tests_that_exist(doc):
    rows = _rows(doc)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 20
    twin = _defined(ROOT / "scratchlm" / "reference" / "numpy_gpt.py")
    tour = (ROOT / "docs" / "tour.md").read_text(encoding="utf-8")
    for number, _, code, numpy_twin, test, section in rows:
        path, _, names = code.strip("`").partition(": ")
        defined = _defined(ROOT / path)
        for name in re.findall(r"[A-Za-z_][\w.]*", names):
            assert name in defined, (number, path, name)
        for name in re.findall(r"`([\w.]+)`", numpy_twin):
            assert name in twin, (number, name)
        test_file, _, test_name = test.strip("`").partition("::")
        assert test_name in _defined(ROOT / test_file), (number, test)
        assert re.search(rf"^##+ {re.escape(section)}\. ", tour, re.M), (number, section)


def test_the_two_languages_list_the_same_stations():
    en, zh = (_rows(doc) for doc in DOCS)
    assert [(r[0], r[2].replace("、", ", "), r[4], r[5]) for r in zh] == [(r[0], r[2], r[4], r[5]) for r in en]
