"""No import circles anywhere in taskhook's code, module by module.

``lint-imports`` (pyproject.toml, ``[tool.importlinter]``) checks the rooms'
layering and that no two siblings of a package import each other
(``acyclic_siblings``). That contract cannot see a circle between a package
and one of its own modules -- ``worker.cli`` importing its command modules
while they imported it back for a hook was one -- so this test looks at the
whole graph, built by grimp (import-linter's own graph library), and names
every circle it finds. Imports inside functions and under TYPE_CHECKING
count: each is a dependency a reader follows all the same.
"""

from __future__ import annotations

import grimp

ROOMS = ("models", "ingest", "worker", "migrations", "bench")


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module
    (Tarjan's algorithm, iterative: the graph is deep enough to matter)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def imports_of(module: str):
        return iter(sorted(graph.find_modules_directly_imported_by(module)))

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, imports_of(root))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = lowest[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, imports_of(other)))
                    break
                if other in on_stack:
                    lowest[module] = min(lowest[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowest[parent] = min(lowest[parent], lowest[module])
                if lowest[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph(*ROOMS, exclude_type_checking_imports=False)
    assert _circles(graph) == []


def test_a_circle_is_found_when_there_is_one():
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="a.b")
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a")
    graph.add_import(importer="d", imported="a")
    assert _circles(graph) == [["a", "a.b", "a.c"]]
