"""`@pypi`: the uv environment's Python and packages, as Bazel targets (offline).

Bazel fetches no Python package here. The repository rule finds the project's interpreter
(`<workspace>/.venv/bin/python`, made by `uv sync`; else `python3` on PATH), checks that each
package imports in it, and writes:

* `@pypi//<name>`: an empty `py_library` per package (the package itself is on the interpreter's
  path), so BUILD files still state what each target needs;
* `@pypi//:python_toolchain`: a Python 3 toolchain whose runtime is that interpreter, registered
  in WORKSPACE, so every `py_test` runs under the environment `uv run pytest` uses.
"""

def _interpreter(ctx):
    venv_python = ctx.path(ctx.attr.workspace_file).dirname.get_child(".venv").get_child("bin").get_child("python")
    if venv_python.exists:
        return str(venv_python)
    found = ctx.which("python3")
    if found == None:
        fail("no Python: run `uv sync` in the workspace (it makes .venv/bin/python), or put python3 on PATH")
    return str(found)

def _venv_packages_impl(ctx):
    python = _interpreter(ctx)
    modules = ctx.attr.packages.values()
    check = "import importlib, sys\nmissing = []\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n    except ImportError:\n        missing.append(m)\nprint('missing:' + ' '.join(missing))\n"
    result = ctx.execute([python, "-c", check] + modules, environment = {"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout = 600)
    if result.return_code != 0:
        fail("@pypi: {} could not check its packages: {}".format(python, result.stderr))
    # The last line is the verdict (importing a package may print, e.g. keras_nlp's backend).
    missing = result.stdout.strip().split("\n")[-1][len("missing:"):]
    if missing:
        fail("@pypi: {} cannot import {}; run `uv sync` in the workspace".format(python, missing))
    for name in ctx.attr.packages:
        ctx.file(name + "/BUILD", "\n".join([
            "# `{}`, installed in {} (checked when this repository was made).".format(name, python),
            'py_library(name = "{}", visibility = ["//visibility:public"])'.format(name),
            "",
        ]))
    ctx.file("BUILD", "\n".join([
        'load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")',
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
        'py_runtime(name = "python3", interpreter_path = "{}", python_version = "PY3")'.format(python),
        "",
        'py_runtime_pair(name = "runtime_pair", py3_runtime = ":python3")',
        "",
        "toolchain(",
        '    name = "python_toolchain",',
        '    toolchain = ":runtime_pair",',
        '    toolchain_type = "@bazel_tools//tools/python:toolchain_type",',
        ")",
        "",
    ]))
    ctx.file("WORKSPACE", 'workspace(name = "pypi")\n')

venv_packages = repository_rule(
    implementation = _venv_packages_impl,
    attrs = {
        "packages": attr.string_dict(doc = "Bazel name (as in `@pypi//<name>`) -> module to import."),
        "workspace_file": attr.label(default = "//:WORKSPACE"),
    },
    local = True,
    doc = "The uv environment's interpreter and packages (see the module docstring).",
)
