"""The repository's imports, read with `ast`: one import path per name, and no cycles.

Across tffl/, models/, tasks/, runner/, benchmarks/, experiments/, scripts/ and tests/:

- **no re-export**: a module does not import a name from another project module unless it uses it
  (a package's `__init__` that lists its own public API in `__all__` excepted);
- **no renamed module**: a project module is imported under its own name, or with TFF's `_lib`
  suffix (`from tffl.engine import process as process_lib`), never as another module's name
  (`as engine`, `as simulation`);
- **no private import**: no module imports another module's `_name`;
- **no cycle**: the graph of module imports, function-level imports included, has no cycle.

>>> _module_name(ROOT / "tffl" / "engine" / "__init__.py")
'tffl.engine'
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tffl", "models", "tasks", "runner", "benchmarks", "experiments", "scripts", "tests")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if ".venv" not in p.parts and "bazel-" not in str(p)}


MODULES = _modules()


def _is_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _imports(tree: ast.AST):
    """(module imported from, name or None, alias or None, node) for every project import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_project(alias.name):
                    yield alias.name, None, alias.asname, node
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_project(
                node.module):
            for alias in node.names:
                yield node.module, alias.name, alias.asname, node


def _all_list(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def test_no_module_re_exports_a_name_it_imports():
    found = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" and _all_list(tree):
            continue
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.value.id for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        exported = set(_all_list(tree))
        for source, imported, alias, node in _imports(tree):
            if imported is None or f"{source}.{imported}" in MODULES:
                continue  # a module, not a name
            local = alias or imported
            if local not in used or local in exported:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {local} (from {source})")
    assert not found, "imported but not used here (import it from its module instead):\n" + (
        "\n".join(found))


def test_no_project_module_is_imported_under_another_name():
    found = []
    for path in MODULES.values():
        for source, imported, alias, node in _imports(ast.parse(path.read_text())):
            module = source if imported is None else f"{source}.{imported}"
            if module not in MODULES or alias is None:
                continue
            own = module.rsplit(".", 1)[-1]
            if alias not in (own, f"{own}_lib"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module} as {alias}")
    assert not found, "modules imported under another name:\n" + "\n".join(found)


def test_no_module_imports_another_modules_private_names():
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: {source}.{imported}"
             for path in MODULES.values()
             for source, imported, _, node in _imports(ast.parse(path.read_text()))
             if imported and imported.startswith("_") and not imported.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for source, imported, _, _ in _imports(ast.parse(path.read_text())):
            module = f"{source}.{imported}" if imported and f"{source}.{imported}" in MODULES else source
            if module in MODULES and module != name:
                targets.add(module)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for start, targets in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(targets)))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]; counter[0] += 1
                    stack.append(child); on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop(); on_stack.discard(member); component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(
        " -> ".join(c) for c in cycles)
