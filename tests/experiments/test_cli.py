"""experiments.cli: the shared flag checks and output helpers of the scripts."""

import pathlib

import pytest

from experiments import cli


@pytest.mark.parametrize("argv, verbose", [
    (["--verbosity=1"], True), (["-v", "1"], True), (["--rounds=3", "-v=2"], True),
    (["--rounds=3", "--learning_rate=0.1"], False), ([], False),
])
def test_verbosity_requested(argv, verbose):
    assert cli.verbosity_requested(argv) is verbose


def test_quiet_python_logs_leaves_a_verbose_run_alone(monkeypatch):
    import logging

    absl_logger = logging.getLogger("absl")
    monkeypatch.setattr(absl_logger, "level", logging.INFO)
    monkeypatch.setattr(logging.getLogger("tensorflow"), "level",
                        logging.getLogger("tensorflow").level)  # restored after the test
    monkeypatch.setattr("sys.argv", ["train.py", "--verbosity=1"])
    cli.quiet_python_logs()
    assert absl_logger.level == logging.INFO
    monkeypatch.setattr("sys.argv", ["train.py"])
    monkeypatch.setattr("warnings.filters", [])  # restored after the test
    cli.quiet_python_logs()
    assert absl_logger.level == logging.ERROR


@pytest.mark.parametrize("values, expected", [(["1", "3"], (1, 3)), (["2"], (2,))])
def test_int_list(values, expected):
    assert cli.int_list("clients", values) == expected


def test_int_list_and_output_dir_errors_name_the_flag(tmp_path):
    with pytest.raises(cli.UsageError, match="clients"):
        cli.int_list("clients", ["x"])
    blocker = pathlib.Path(tmp_path) / "file"
    blocker.write_text("")
    with pytest.raises(cli.UsageError, match="--output_dir"):
        cli.writable_output_dir(blocker / "sub")
