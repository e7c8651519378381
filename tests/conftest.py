"""Shared pytest set-up: quiet TensorFlow logs and locate the read-only shared data folder."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Frozen (base) weights files of the processes built by tests go to a throw-away folder, not to
# the user's cache (subprocesses inherit it).
if "TFFL_FROZEN_DIR" not in os.environ:
    import tempfile

    os.environ["TFFL_FROZEN_DIR"] = tempfile.mkdtemp(prefix="tffl_frozen_")

import pytest  # noqa: E402

# A program the distribute tests run as a child (it sets up logical devices when imported), not a
# module for `--doctest-modules` to import.
collect_ignore = ["tffl/runtime/distribute_parity.py"]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Under Bazel (tests/pytest_main.py) a target runs every test of its file, both tiers: the
    default `-m "not large"` of pyproject.toml would leave a file of large tests with none."""
    if "TEST_SRCDIR" in os.environ and config.option.markexpr == "not large":
        config.option.markexpr = ""
SHARED_DIR = REPO_ROOT.parent / "shared"
SHARED_DATA = SHARED_DIR / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """`../shared/data` beside the checkout; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it ships beside the checkout as ../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def tff_runtime():
    """One managed TFF worker for a test module (`tffl.runtime.local_runtime`); checks at the end
    that no `worker_binary` is left running. Module-scoped, not session-scoped: the runtime's
    context sits on TFF's context stack while it is open, and other modules (tffl/runtime's tests,
    the in-process runs of scripts) install contexts of their own and check that no worker runs."""
    from tffl import runtime

    with runtime.local_runtime() as context:
        yield context
    assert runtime.running_workers() == []
