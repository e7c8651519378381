"""models/'s place in the layout, read off the source with `ast` (function-level imports
included): of tffl it imports the variable roles (`tffl.engine.roles`) only, what its layers tag
their variables with; what needs the engine (a process's starting weights, the stochastic-layer
rule) is passed in or lives with its callers. It imports none of tasks/, runner/, experiments/,
benchmarks/ or scripts/."""

import ast
import pathlib

MODELS = pathlib.Path(__file__).resolve().parents[2] / "models"
ALLOWED_FROM_TFFL = {"tffl.engine.roles"}
NOT_IMPORTED = ("tasks", "runner", "experiments", "benchmarks", "scripts")


def _imported(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module or `module.name`, line) of every import of the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
    return found


def test_models_takes_only_the_roles_from_tffl_and_nothing_from_the_packages_above_it():
    offenders, read = [], 0
    for path in sorted(MODELS.rglob("*.py")):
        for name, line in _imported(path):
            read += 1
            top = name.split(".")[0]
            if (top == "tffl" and name not in ALLOWED_FROM_TFFL) or top in NOT_IMPORTED:
                offenders.append(f"{path.relative_to(MODELS.parent)}:{line} imports {name}")
    assert not offenders, offenders
    assert read > 100   # the imports are read
