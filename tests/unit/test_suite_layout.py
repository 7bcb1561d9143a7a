"""The suite's own layout: a test module or a conftest imports the helpers it
shares with others from tests/support/, never from a conftest or another test
module -- importing a module that defines fixtures or tests brings them along,
and a helper found only by reading another test is one a newcomer misses."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_modules(source: str) -> list[str]:
    """The ``tests.*`` modules ``source`` imports that are not in tests.support."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [
            name
            for name in names
            if name.split(".")[0] == "tests" and not name.startswith("tests.support")
        ]
    return found


def test_the_check_sees_an_import_from_a_conftest_or_a_test_module():
    source = (
        "from tests.conftest import Store\n"
        "import tests.integration.test_cli\n"
        "from tests.support.stores import TRUSTED\n"
        "def later():\n"
        "    from tests.e2e.conftest import wait_until\n"
    )
    assert imported_test_modules(source) == [
        "tests.conftest",
        "tests.integration.test_cli",
        "tests.e2e.conftest",
    ]


def test_tests_import_shared_helpers_from_tests_support_only():
    offenders = {
        str(path.relative_to(TESTS)): modules
        for path in sorted(TESTS.rglob("*.py"))
        if (modules := imported_test_modules(path.read_text()))
    }
    assert offenders == {}, "import these from tests/support/ instead"
