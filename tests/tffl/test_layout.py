"""The layout's rules (docs/engine.md), read off the source with `ast`: federated computations are
assembled only in `tffl/engine/`, and the import graph of tffl's modules (function-level imports
included) has no cycle. (A module is one job, whatever its length: no size limit.)"""

import ast
import pathlib

TFFL = pathlib.Path(__file__).resolve().parents[2] / "tffl"


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted(TFFL.rglob("*.py")):
        name = ".".join(path.relative_to(TFFL.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def test_federated_computations_are_assembled_in_the_engine_only():
    users = [str(p.relative_to(TFFL)) for p in _modules().values()
             if "tff.federated_computation" in p.read_text()]
    assert users and all(u.startswith("engine/") for u in users), users


def _imports(module: str, path: pathlib.Path, modules) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tffl"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tffl"))
    return {m for m in found if m in modules and m != module}


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    state, cycles = {}, []

    def visit(module, stack):
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles
    assert "tffl.engine.rounds" in graph["tffl.algorithms.lora_fl"]   # the graph is read
