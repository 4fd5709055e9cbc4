"""The benchmark does not import the test suite: what both need lives in ``harness/`` (issue 27).

``bench/`` is type-checked and runs from ``python -m bench``; ``tests/`` is pytest's (conftest side effects,
fixtures, pytest itself). Parsed with :mod:`ast`, so an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an ``import`` or ``from … import`` statement in ``tree`` names (relative ones left out)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_bench_module_imports_the_tests() -> None:
    modules = sorted((ROOT / "bench").rglob("*.py"))
    assert modules, "no bench modules found"
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in imported_modules(ast.parse(path.read_text(), str(path)))
            if name == "tests" or name.startswith("tests.")
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_check_sees_imports_at_any_depth() -> None:
    source = (
        "import tests.conftest\n\ndef f():\n    from tests.fixtures import fix_pg\n    import testsuite\n"
    )
    assert imported_modules(ast.parse(source)) == {"tests.conftest", "tests.fixtures", "testsuite"}
