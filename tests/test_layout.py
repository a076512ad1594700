"""The test folder's own layout: no test file over 600 lines, and no test file's code imported by
another. What test files share lives in tests/helpers.py (fixtures in conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MAX_LINES = 600


def _test_files() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def _imported_test_modules(path: Path) -> list[str]:
    """`line: module` for each import of a test_*.py module in path, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names
                  if name.split(".")[0].startswith("test_") or name.startswith("tests.test_")]
    return found


def test_no_test_file_is_over_600_lines():
    files = _test_files()
    assert len(files) > 40  # the glob found the suite
    long = {p.name: n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"test files over {MAX_LINES} lines (split them by the module they test): {long}"


def test_no_file_in_tests_imports_a_test_file():
    imports = {p.name: found for p in sorted(TESTS.glob("*.py")) if (found := _imported_test_modules(p))}
    assert not imports, f"imports of test files (move what they share to tests/helpers.py): {imports}"


def test_the_checks_see_an_import_of_a_test_file(tmp_path):
    """The check itself: each way of writing such an import is found, other imports are not."""
    source = ("import test_model\nfrom test_serve import Served\nimport tests.test_data as td\n"
              "def f():\n    from test_generate import TINY\n"
              "from helpers import Served\nimport conftest\nfrom scratchlm.model import gpt\n")
    (tmp_path / "test_example.py").write_text(source, encoding="utf-8")
    assert _imported_test_modules(tmp_path / "test_example.py") == [
        "1: test_model", "2: test_serve", "3: tests.test_data", "5: test_generate"]
