"""The package's own house rules (CONTRIBUTING.md, Conventions), measured from its source: files at
most 600 lines, functions at most 60, classes at most 200 (a dataclass excepted), at most 8
parameters a function, at most 15 modules at the package's top, and no private (_underscore) name
imported from another folder of the package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scratchlm"
MAX_FILE, MAX_FUNCTION, MAX_CLASS, MAX_PARAMS, MAX_TOP = 600, 60, 200, 8, 15


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _param_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters; self, cls, an autograd Function's ctx and *args/**kwargs not counted."""
    args = node.args
    named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return len([n for n in named if n not in ("self", "cls", "ctx")])


def _oversized(path: Path, rel: str) -> list[str]:
    """`rel:line what` for each rule the file breaks."""
    source = path.read_text(encoding="utf-8")
    found = []
    if (n := source.count("\n")) > MAX_FILE:
        found.append(f"{rel}: {n} lines (at most {MAX_FILE})")
    for node in ast.walk(ast.parse(source, filename=rel)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if length > MAX_FUNCTION:
                found.append(f"{rel}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION})")
            if (p := _param_count(node)) > MAX_PARAMS:
                found.append(f"{rel}:{node.lineno} {node.name}: {p} parameters (at most {MAX_PARAMS})")
        elif isinstance(node, ast.ClassDef) and length > MAX_CLASS and not _is_dataclass(node):
            found.append(f"{rel}:{node.lineno} class {node.name}: {length} lines (at most {MAX_CLASS})")
    return found


def _folder(module: str, package: Path) -> str:
    """The folder of the package a dotted module lives in (the package's name for its top)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (package / parts[1]).is_dir() else parts[0]


def _private_imports(path: Path, package: Path) -> list[str]:
    """`rel:line name from module` for each _name imported from another folder of the package."""
    rel = path.relative_to(package.parent)
    module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = here.split(".")[: len(here.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if not source.startswith(package.name):
            continue
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and _folder(source, package) != _folder(here, package):
                found.append(f"{rel}:{node.lineno} {alias.name} from {source}")
    return found


def _house_rules(package: Path) -> list[str]:
    files = sorted(package.rglob("*.py"))
    broken = []
    for path in files:
        broken += _oversized(path, str(path.relative_to(package.parent)))
        broken += _private_imports(path, package)
    top = [p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    if len(top) > MAX_TOP:
        broken.append(f"{package.name}/: {len(top)} modules at the top (at most {MAX_TOP})")
    return broken


def test_the_package_keeps_its_house_rules():
    assert len(list(PACKAGE.rglob("*.py"))) > 40  # the glob found the package
    broken = _house_rules(PACKAGE)
    assert not broken, "house rules broken (CONTRIBUTING.md, Conventions):\n" + "\n".join(broken)


def test_the_rules_see_each_kind_of_break(tmp_path):
    """The check itself, on a made-up package that breaks each rule once and keeps them elsewhere."""
    pkg = tmp_path / "scratchlm"
    (pkg / "model").mkdir(parents=True)
    (pkg / "kernels").mkdir()
    for folder in (pkg, pkg / "model", pkg / "kernels"):
        (folder / "__init__.py").write_text("", encoding="utf-8")
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    (pkg / "model" / "big.py").write_text(
        "def long_one():\n" + long_body
        + "def many(self, a, b, c, d, e, f, g, h, i, *args, **kw):\n    pass\n"
        + "def fine(self, a, b, c, d, e, f, g, h, *args, **kw):\n    pass\n"
        + "class Wide:\n" + "".join(f"    y{i} = {i}\n" for i in range(MAX_CLASS))
        + "@dataclass\nclass Settings:\n" + "".join(f"    z{i}: int = {i}\n" for i in range(MAX_CLASS))
        + "def _helper():\n    pass\n", encoding="utf-8")
    (pkg / "model" / "near.py").write_text("from .big import _helper\n", encoding="utf-8")
    (pkg / "kernels" / "far.py").write_text(
        "from scratchlm.model.big import _helper, fine\nfrom ..model import big\n"
        "from ..model.big import _helper as h\n", encoding="utf-8")
    (pkg / "model" / "huge.py").write_text("x = 1\n" * (MAX_FILE + 1), encoding="utf-8")
    for i in range(MAX_TOP + 1):
        (pkg / f"top{i}.py").write_text("", encoding="utf-8")
    broken = _house_rules(pkg)
    assert sorted(broken) == sorted([
        f"scratchlm/model/big.py:1 long_one: {MAX_FUNCTION + 1} lines (at most {MAX_FUNCTION})",
        f"scratchlm/model/big.py:{MAX_FUNCTION + 2} many: 9 parameters (at most {MAX_PARAMS})",
        f"scratchlm/model/big.py:{MAX_FUNCTION + 6} class Wide: {MAX_CLASS + 1} lines (at most {MAX_CLASS})",
        f"scratchlm/model/huge.py: {MAX_FILE + 1} lines (at most {MAX_FILE})",
        "scratchlm/kernels/far.py:1 _helper from scratchlm.model.big",
        "scratchlm/kernels/far.py:3 _helper from scratchlm.model.big",
        f"scratchlm/: {MAX_TOP + 1} modules at the top (at most {MAX_TOP})",
    ])
