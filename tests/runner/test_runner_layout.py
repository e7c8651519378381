"""The runner's place in the layout, read off the source with `ast` (function-level imports
included): the runner imports neither the papers' experiments (experiments/) nor the benchmark
(benchmarks/) nor the scripts, and those two packages use the runner as any client would, through
its public modules and names, never a `_private` one. (models/'s own rule, that of tffl it takes
the variable roles only, is tests/models/test_models_layout.py.)"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = "runner"
CLIENTS = ("experiments", "benchmarks")


def _modules(package: str) -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _imports(path: pathlib.Path) -> list[tuple[str, list[str], int]]:
    """(module, the names imported from it (empty for `import module`), line) of every import
    statement of the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    return found


def _where(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _package(module: str) -> str:
    return module.split(".")[0]


def test_the_runner_imports_no_client_of_it():
    offenders = [f"{_where(path)}:{line} imports {module}"
                 for path in _modules(RUNNER).values()
                 for module, _, line in _imports(path)
                 if _package(module) in (*CLIENTS, "scripts")]
    assert not offenders, offenders


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _runner_private_uses(path: pathlib.Path, runner_modules: set[str]) -> list[str]:
    """What a client file takes of the runner that is not public: a `_name` imported from a
    runner module, a private runner module, or `module._name` read off a runner module it
    imported."""
    found, bound = [], {}
    for module, names, line in _imports(path):
        if _package(module) != RUNNER:
            continue
        if any(_private(part) for part in module.split(".")):
            found.append(f"{_where(path)}:{line} imports {module}")
        for name in names:
            if _private(name):
                found.append(f"{_where(path)}:{line} imports {module}.{name}")
            elif f"{module}.{name}" in runner_modules:
                bound[name] = f"{module}.{name}"
        if not names:
            bound[module] = module
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            found.append(f"{_where(path)}:{node.lineno} reads "
                         f"{bound[node.value.id]}.{node.attr}")
    return found


def test_experiments_and_the_benchmark_use_the_runner_as_clients():
    runner_modules = set(_modules(RUNNER))
    offenders, used = [], set()
    for package in CLIENTS:
        for path in _modules(package).values():
            offenders += _runner_private_uses(path, runner_modules)
            used |= {module for module, _, _ in _imports(path) if _package(module) == RUNNER}
    assert not offenders, offenders
    assert {"runner.running", "runner.report"} <= used   # the imports are read


def test_a_private_name_taken_from_the_runner_is_found(tmp_path):
    client = tmp_path / "client.py"
    client.write_text("from runner import run\nfrom runner.cli import _StdoutHandler\n"
                      "def f():\n    return run._one_line\n")
    found = _runner_private_uses(client, {"runner.run", "runner.cli"})
    assert [f.split(" ", 1)[1] for f in found] == [
        "imports runner.cli._StdoutHandler", "reads runner.run._one_line"]
