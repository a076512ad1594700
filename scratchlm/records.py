"""Settings records read as rows: each field of a dataclass with its kind, its default and the
docstring written under it. The command line's flags (`scratchlm train`, `scratchlm generate`)
and the playground's settings are made from these rows, so a field's name, default and help are
written once, in the record.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SettingField:
    """One field of a settings record."""

    name: str
    kind: str
    """`int`, `float`, `str`, `bool` or `dict` (from the annotation)."""
    optional: bool
    """None is an accepted value (`none` on train's command line, a flag left out on generate's, an
    empty field on the page)."""
    default: Any
    doc: str
    """The docstring under the field, on one line."""


def field_docs(cls) -> dict[str, str]:
    """The docstring written under each field of a dataclass (read from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def setting_fields(cls) -> list[SettingField]:
    """The fields of the dataclass `cls` in their order; a field of another kind (a nested record,
    a tuple) has the kind `other`."""
    docs = field_docs(cls)
    rows = []
    for f in fields(cls):
        annotation = str(f.type)
        head = annotation.split("|")[0].strip()
        kind = head if head in ("bool", "int", "float", "str") else "dict" if "dict" in annotation else "other"
        default = f.default if f.default is not MISSING else None
        rows.append(SettingField(f.name, kind, "None" in annotation, default, docs.get(f.name, "")))
    return rows
