"""The style rule on signatures: functions take a config object rather than long keyword lists.

No public function or method (`__init__` included) of the packages tffl/, models/, tasks/,
runner/, benchmarks/ and experiments/ takes more than `MAX_PARAMETERS` parameters, counting every
one: positional, keyword-only, `*args` and `**kwargs` one each; a method's `self`/`cls` does not
count. Exempt: private names (`_name`, not dunders) and the methods of private classes, the
methods of `@dataclasses.dataclass` classes (a dataclass is the config object), and functions or
classes nested inside functions. The source is read with `ast`: nothing is imported.
"""

import ast
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tffl", "models", "tasks", "runner", "benchmarks", "experiments")
MAX_PARAMETERS = 8


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_dataclass(node: ast.ClassDef) -> bool:
    """Decorated `@dataclasses.dataclass` or `@dataclass`, with or without arguments."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def _is_staticmethod(node) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)


def parameter_count(node, method: bool) -> int:
    """Every parameter of `node` (a function definition), without a method's `self`/`cls` (its
    first positional parameter, unless it is a `@staticmethod`)."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    count = (len(positional) + len(args.kwonlyargs) + (args.vararg is not None)
             + (args.kwarg is not None))
    if method and positional and not _is_staticmethod(node):
        count -= 1
    return count


def offenders(source: str, path: str) -> list[str]:
    """`path:line name (N parameters)` of each public function or method of `source` taking
    more than `MAX_PARAMETERS` parameters (module docstring); methods are named `Class.name`."""
    found = []

    def visit(body, owner: str | None, exempt: bool):
        for node in body:
            if isinstance(node, ast.ClassDef):
                qualified = node.name if owner is None else f"{owner}.{node.name}"
                visit(node.body, qualified,
                      exempt or _is_private(node.name) or _is_dataclass(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = parameter_count(node, method=owner is not None)
                if not exempt and not _is_private(node.name) and count > MAX_PARAMETERS:
                    name = node.name if owner is None else f"{owner}.{node.name}"
                    found.append(f"{path}:{node.lineno} {name} ({count} parameters)")

    visit(ast.parse(source, filename=path).body, None, False)
    return found


def test_the_rule_counts_every_parameter_but_self_and_exempts_what_it_says():
    source = '''
import dataclasses

def nine(a, b, c, d, e, f, g, h, i): pass
def eight(a, b, c, d, e, f, *args, **kwargs): pass
def keywords(a, /, b, *, c, d, e, f, g, h, i): pass
def _private(a, b, c, d, e, f, g, h, i): pass
def outer():
    def nested(a, b, c, d, e, f, g, h, i): pass
    class Local:
        def __init__(self, a, b, c, d, e, f, g, h, i): pass

class Layer:
    def __init__(self, a, b, c, d, e, f, g, h): pass
    def call(self, a, b, c, d, e, f, g, h, *args): pass
    @classmethod
    def make(cls, a, b, c, d, e, f, g, h): pass
    @staticmethod
    def helper(a, b, c, d, e, f, g, h, i): pass
    class Inner:
        def run(self, a, b, c, d, e, f, g, h, **kwargs): pass

class _Hidden:
    def __init__(self, a, b, c, d, e, f, g, h, i): pass

@dataclasses.dataclass(frozen=True)
class Config:
    def method(self, a, b, c, d, e, f, g, h, i): pass
'''
    assert offenders(source, "m.py") == [
        "m.py:4 nine (9 parameters)",
        "m.py:6 keywords (9 parameters)",
        "m.py:15 Layer.call (9 parameters)",
        "m.py:19 Layer.helper (9 parameters)",
        "m.py:21 Layer.Inner.run (9 parameters)",
    ]


def test_no_public_function_takes_more_than_eight_parameters():
    found = []
    for package in PACKAGES:
        files = sorted((REPO_ROOT / package).rglob("*.py"))
        assert files, f"no Python files under {REPO_ROOT / package}"
        for path in files:
            relative = path.relative_to(REPO_ROOT).as_posix()
            found += offenders(path.read_text(encoding="utf-8"), relative)
    assert not found, (
        f"{len(found)} public functions or methods take more than {MAX_PARAMETERS} parameters; "
        "pass a frozen dataclass (a config object) instead:\n" + "\n".join(found))
