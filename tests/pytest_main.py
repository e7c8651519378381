"""The `main` of every Bazel `py_test` here (tests/pytest.bzl): runs one test file under pytest.

Bazel runs it in the test's runfiles tree with the file's path as argument; pytest then reads the
repository's configuration (pyproject.toml) and conftest.py files, as `uv run pytest <file>` does.
Bazel's own conventions are honoured: the test's temporary directory (TEST_TMPDIR), the JUnit XML
it collects (XML_OUTPUT_FILE) and `bazel test --test_filter=EXPR` (pytest's `-k EXPR`).
"""

import os
import sys

import pytest


def pytest_args(argv: list[str], environ: dict[str, str]) -> list[str]:
    """pytest's arguments for the test file(s) in `argv` under Bazel's test environment.

    >>> pytest_args(["tests/tffl/test_roles.py"], {"TEST_TMPDIR": "/t", "TESTBRIDGE_TEST_ONLY": "mean"})
    ['-p', 'no:cacheprovider', '--basetemp=/t/pytest', '-k', 'mean', 'tests/tffl/test_roles.py']
    """
    args = ["-p", "no:cacheprovider"]  # the runfiles tree is read-only
    if "TEST_TMPDIR" in environ:
        args.append(f"--basetemp={environ['TEST_TMPDIR']}/pytest")
    if "XML_OUTPUT_FILE" in environ:
        args.append(f"--junitxml={environ['XML_OUTPUT_FILE']}")
    if environ.get("TESTBRIDGE_TEST_ONLY"):
        args += ["-k", environ["TESTBRIDGE_TEST_ONLY"]]
    return args + argv


if __name__ == "__main__":
    sys.exit(pytest.main(pytest_args(sys.argv[1:], dict(os.environ))))
