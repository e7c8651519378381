"""`pytest_test`: a `py_test` that runs its test file's tests through pytest.

A test file here has no `main`: without one, a plain `py_test` would import the file and pass
without running a test. `pytest_test(name = "test_x", ...)` runs `pytest tests/<pkg>/test_x.py`
(tests/pytest_main.py) with the repository's pytest configuration and conftest.py files.
"""

load("@rules_python//python:defs.bzl", "py_library", "py_test")

def pytest_test(name, srcs = None, deps = [], data = [], **kwargs):
    """A py_test running `name + ".py"` under pytest; `srcs` adds the modules it imports."""
    test_file = name + ".py"
    srcs = srcs or [test_file]
    if test_file not in srcs:
        srcs = [test_file] + srcs
    py_test(
        name = name,
        srcs = srcs + ["//tests:pytest_main.py", "//tests:conftest.py"],
        main = "//tests:pytest_main.py",
        args = ["$(location {})".format(test_file)],
        data = data + ["//:pyproject.toml"],
        deps = deps + ["@pypi//pytest"],
        # No generated __init__.py files: tests/ has none, so pytest imports a test file as a
        # top-level module (its folder on sys.path), as under `uv run pytest`.
        legacy_create_init = False,
        **kwargs
    )

def pytest_suite(deps, sizes = {}, data = []):
    """One `pytest_test` per `test_*.py` file of the calling package.

    Each target's srcs are all the package's .py files (tests import helpers and each other's
    fixtures, e.g. `tests.tffl.algorithms.eager_reference`). `sizes` maps a test name to its Bazel size
    (default "large": a 15-minute timeout, the pytest-timeout of pyproject.toml).
    """
    helpers = native.glob(["*.py"])
    for test_file in native.glob(["test_*.py"]):
        name = test_file[:-len(".py")]
        pytest_test(
            name = name,
            srcs = helpers,
            deps = deps,
            data = data + native.glob(["conftest.py"]),
            size = sizes.get(name, "large"),
        )

def pytest_helpers(deps):
    """`:helpers`, the calling package's .py files (helper modules, and test files other packages
    import) as a library for the suites of other packages."""
    py_library(
        name = "helpers",
        testonly = True,
        srcs = native.glob(["*.py"]),
        visibility = ["//tests:__subpackages__"],
        deps = deps,
    )
