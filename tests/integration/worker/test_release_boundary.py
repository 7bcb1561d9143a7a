"""No webhook handler and no delivery task reaches the operator's release.

Release frees an identity so that a later create makes a new task; it must
never be automated (docs/contract.md, "Release"). This walks the import
graph -- statically, so a code path that is rarely taken is checked too --
from every module of ``ingest`` and from the delivery side of ``worker``, and
asserts that none of the modules reached imports ``worker.operator``, and
none uses ``release_external_id``, the RELEASE_IDENTITY name or its literal
value.

Every ``ingest`` module is a root -- a new one is checked without anyone
remembering to list it -- except the operator surfaces and the app that
mounts everything, named in OPERATOR_SURFACES and COMPOSITION_ROOTS below
with the reason each may reach release.

The walk follows every ``import`` in a module (inside functions too) and the
packages a module's import runs first. ``worker.celery_app`` is reached that
way (``worker/__init__.py`` hands out its app) and is the one module allowed
to name RELEASE_IDENTITY: its route table sends that message to the operator
queue. It is checked separately: it may route the name, never send it, and it
imports nothing of ``worker.operator`` (the worker loads that by name).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from models.broker.messages import RELEASE_IDENTITY

ROOT = Path(__file__).resolve().parents[3]
FIRST_PARTY = ("models", "ingest", "worker")
OPERATOR_MODULE = "worker.operator"
FORBIDDEN_NAMES = frozenset({"release_external_id", "RELEASE_IDENTITY"})
#: The composition root: routes every message name to its queue.
ROUTER = "worker.celery_app"

DELIVERY_SIDE = ("worker.tasks", "worker.processing", "worker.sweeper")

#: Modules that may reach release, and why. Not roots; a root that reaches
#: one of them fails like any other.
OPERATOR_SURFACES = {
    "ingest.api": "the REST release route, for operator-role tokens (docs/contract.md, 'Release')",
}
COMPOSITION_ROOTS = {
    "ingest.app": "mounts the webhook routes and the REST API side by side",
}


def _webhook_side() -> list[str]:
    modules = {f"ingest.{path.stem}" for path in (ROOT / "ingest").glob("*.py")}
    return sorted(modules - set(OPERATOR_SURFACES) - set(COMPOSITION_ROOTS))


def _path_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_path_of(module).read_text(), filename=str(_path_of(module)))


def _is_package(module: str) -> bool:
    return _path_of(module).name == "__init__.py"


def _imports(module: str) -> set[str]:
    """First-party modules ``module`` imports, anywhere in its body, and the
    packages each of those imports runs first."""
    found: set[str] = set()
    package = module if _is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from worker import runtime` imports worker.runtime if it is a module.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in FIRST_PARTY and _path_of(name) is not None:
                found.add(name)
    with_parents = set(found)
    for name in found | {module}:
        parts = name.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return with_parents - {module}


def _closure(root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imports(module) - seen)
    return seen


def _uses_of_release(module: str) -> list[str]:
    """Where ``module`` uses a forbidden name (definitions do not count)."""
    uses = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            if isinstance(node.ctx, ast.Load):
                uses.append(f"{module}:{node.lineno} uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            uses.append(f"{module}:{node.lineno} uses .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in FORBIDDEN_NAMES:
                    uses.append(f"{module}:{node.lineno} imports {alias.name}")
        elif (
            isinstance(node, ast.Constant)
            and node.value == RELEASE_IDENTITY
            and module != "models.broker.messages"  # where the name is defined
        ):
            uses.append(f"{module}:{node.lineno} spells {RELEASE_IDENTITY!r}")
    return uses


@pytest.mark.parametrize("root", _webhook_side() + list(DELIVERY_SIDE))
def test_no_webhook_handler_or_delivery_task_reaches_release(root: str):
    reached = _closure(root)

    assert OPERATOR_MODULE not in reached, f"{root} imports {OPERATOR_MODULE}"
    uses = [use for module in sorted(reached - {ROUTER}) for use in _uses_of_release(module)]
    assert uses == []


def test_the_router_only_routes_release_and_never_reaches_the_operator_module():
    assert OPERATOR_MODULE not in _closure(ROUTER)
    uses = _uses_of_release(ROUTER)
    assert uses and all("uses RELEASE_IDENTITY" in use or "imports" in use for use in uses)
    source = _path_of(ROUTER).read_text()
    assert "send_task" not in source and "apply_async" not in source


def test_the_webhook_handlers_are_among_the_roots():
    assert "ingest.webhooks" in _webhook_side()
    for module in (*OPERATOR_SURFACES, *COMPOSITION_ROOTS):
        assert _path_of(module) is not None, f"{module} is gone: drop it from the exceptions"


def test_the_walk_sees_what_it_must_see():
    # Guards against a walk that silently finds nothing.
    assert {"models.tasks", "models.providers.github", "models.providers.jira"} <= _closure(
        "worker.processing"
    )
    assert "worker.celery_app" in _closure("worker.tasks")  # through worker/__init__
    assert {"models.inbox", "models.intake"} <= _closure("ingest.webhooks")
    assert _uses_of_release(OPERATOR_MODULE)  # release is really used there
    # The REST route releases through the retry-safe form, which calls release.
    assert "models.retry_safe" in _closure("ingest.api")
    assert _uses_of_release("models.retry_safe")
