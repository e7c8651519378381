"""runner.cli: the shared flag checks and output helpers of the scripts."""

import pathlib

import pytest

from runner import cli


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


def test_error_exit_is_one_line_and_the_status(monkeypatch, capsys):
    monkeypatch.delenv("TFFL_DEBUG", raising=False)
    try:
        raise ValueError("round 3: training loss is nan")
    except ValueError as e:
        assert cli.error_exit("train.py", e, 1) == 1
        assert cli.error_exit("reproduce.py", e, 2, f"sst2_clients: {e}") == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["train.py: error: round 3: training loss is nan",
                                "reproduce.py: error: sst2_clients: round 3: training loss is nan"]


def test_error_exit_reraises_under_tffl_debug(monkeypatch, capsys):
    monkeypatch.setenv("TFFL_DEBUG", "1")
    with pytest.raises(cli.UsageError, match="--rounds=0") as raised:
        try:
            cli.at_least("rounds", 0, 1)
        except cli.UsageError as e:
            cli.error_exit("train.py", e, 2)
    assert raised.traceback[-1].name == "at_least"  # the original traceback, not a new one
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error, status", [(cli.UsageError("flag --ks=0: must be >= 1"), 2),
                                           (FloatingPointError("seed 1: loss is nan"), 1)])
def test_run_settings_reports_a_failure_as_one_line_and_writes_nothing(
        error, status, tmp_path, monkeypatch, capsys):
    """A setting that fails stops the grid: one stderr line, its status, no table written."""
    import contextlib

    from tffl import runtime
    monkeypatch.delenv("TFFL_DEBUG", raising=False)
    monkeypatch.setattr(runtime, "local_runtime", lambda log_dir: contextlib.nullcontext())
    ran, written = [], []

    def settings(config):
        yield [{"m": 1}]
        ran.append(2)
        raise error

    assert cli.run_settings("grid.py", ["grid.py"], lambda: {"output_dir": tmp_path}, settings,
                            lambda rows, config: written.append(rows) or "") == status
    assert ran == [2] and written == []
    assert capsys.readouterr().err == f"grid.py: error: {error}\n"


def test_run_settings_refuses_a_positional_argument():
    from absl import app
    with pytest.raises(app.UsageError, match="unexpected arguments: extra"):
        cli.run_settings("grid.py", ["grid.py", "extra"], dict, iter, print)


def _define_two(flag_values) -> None:
    d = cli.definer(flag_values)
    d.DEFINE_integer("cli_test_rounds", 5, "Rounds.")
    d.DEFINE_list("cli_test_seeds", "0,1", "Seeds.")


def test_definer_defines_in_the_given_flag_values_for_the_calling_module():
    """The flags land in the FlagValues given (never absl's global FLAGS), as key flags of the
    module that defines them (the one absl's --helpshort lists when it is the script run)."""
    from absl import flags

    flag_values = flags.FlagValues()
    _define_two(flag_values)
    flag_values(["x.py", "--cli_test_rounds=7"])
    assert (flag_values.cli_test_rounds, flag_values.cli_test_seeds) == (7, ["0", "1"])
    assert "cli_test_seeds" not in flags.FLAGS
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(__name__)}
    assert key_flags == {"cli_test_rounds", "cli_test_seeds"}
