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


# Every k-th row of each split: the text tests that check mechanics (bytes, checkpoints, resumes,
# exports) run on real sentences without tokenizing, caching and evaluating 70,000 of them.
SST2_EVERY = {"train": 100, "dev": 4, "test-labeled": 8}
REVIEWS_EVERY = {"train": 10, "dev": 4, "test-labeled": 16}


@pytest.fixture(scope="session")
def sample_data(shared_data, tmp_path_factory) -> pathlib.Path:
    """A data folder like `shared_data` holding every k-th row of its SST-2 and review splits
    (SST-2: train 674, dev 218, test 228 sentences; per review domain: train 170, dev 75, test
    125, balanced), in the same layouts (GLUE TSV; CSV-quoted TSV for the reviews)."""
    import csv

    root = tmp_path_factory.mktemp("sample_data")
    (root / "sst2").mkdir()
    for split, every in SST2_EVERY.items():
        lines = (shared_data / "sst2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        kept = [lines[0]] + lines[1::every]
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(kept) + "\n", encoding="utf-8")
    for domain in sorted((shared_data / "multidomain_sentiment").iterdir()):
        (root / "multidomain_sentiment" / domain.name).mkdir(parents=True)
        for split, every in REVIEWS_EVERY.items():
            with open(domain / f"{split}.tsv", newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f, delimiter="\t", quotechar='"'))
            out = root / "multidomain_sentiment" / domain.name / f"{split}.tsv"
            with open(out, "w", newline="", encoding="utf-8") as f:
                csv.writer(f, delimiter="\t", quotechar='"').writerows([rows[0]] + rows[1::every])
    return root


@pytest.fixture(scope="module")
def tff_runtime():
    """One managed TFF worker for a test module (`tffl.runtime.local_runtime`); checks at the end
    that no `worker_binary` is left running. Module-scoped, not session-scoped: the runtime's
    context sits on TFF's context stack while it is open, and other modules (tffl/runtime's tests,
    the in-process runs of scripts) install contexts of their own and check that no worker runs."""
    from tffl import runtime
    from tffl.runtime import workers

    with runtime.local_runtime() as context:
        yield context
    assert workers.running_workers() == []


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="record each test file's seconds per tier in tests/durations.json "
                          "(tests/durations.py), which orders the files of later runs")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Files run longest first by tests/durations.json (tests/durations.py): pytest-xdist hands
    out whole files in this order (`--dist=loadfile --no-loadscope-reorder`), so the longest
    start early and the two workers finish together."""
    from tests import durations

    durations.order(items, durations.read())


_REPORTS = []


def pytest_runtest_logreport(report):
    """Under xdist the controller gets every worker's reports, so it records them."""
    _REPORTS.append(report)


def pytest_sessionfinish(session):
    if session.config.getoption("--store-durations") and not hasattr(session.config,
                                                                       "workerinput"):
        from tests import durations

        durations.record(_REPORTS)
