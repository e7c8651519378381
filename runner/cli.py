"""What every absl script here shares: one-line flag errors, a writable output folder, quiet logs,
the CSV + Markdown table writer, and the main() of a script that runs a grid of settings.

Nothing here imports TensorFlow at module level, so a script can check its flags (and fail in a
second with one line) before paying for the import.

A script's end is `app.run(main, flags_parser=cli.parse_flags)`. Example:

>>> output_dir = writable_output_dir(run_dir / "cli_example")   # raises UsageError if it cannot
>>> rows = [{"method": "rolora", "accuracy": 0.8312}, {"method": "ffa_lora", "accuracy": 0.8}]
>>> print(write_table(output_dir, "results", rows,
...                   [("method", "method", "{}"), ("test acc", "accuracy", "{:.3f}")]))
| method | test acc |
|---|---|
| rolora | 0.831 |
| ffa_lora | 0.800 |
>>> sorted(p.name for p in output_dir.iterdir())
['results.csv', 'results.md']
>>> at_least("rounds", 0, 1)
Traceback (most recent call last):
...
runner.cli.UsageError: flag --rounds=0: must be >= 1
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence


class UsageError(ValueError):
    """A flag value that cannot work; scripts report it as one line with exit status 2."""


def parse_flags(argv: list[str], flag_values=None, help_text: str | None = None) -> list[str]:
    """absl parsing for `app.run(..., flags_parser=parse_flags)`: a bad value is one line on
    stderr and exit status 2, never a traceback.

    `flag_values`: a script's own `flags.FlagValues` (so that scripts defining flags of the same
    names can be imported in one process); absl's global flags then keep their defaults, and
    `--help` prints `help_text` and the script's flags. Leftover arguments are refused.
    """
    from absl import flags

    name = pathlib.Path(argv[0]).name
    if flag_values is None:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            sys.stderr.write(f"{name}: error: {e}\n")
            sys.exit(2)
    if any(a in ("--help", "-h", "--helpfull", "-?") for a in argv[1:]):
        print((help_text or "") + "\nFlags:\n" + flag_values.get_help())
        sys.exit(0)
    try:
        rest = flag_values(argv)
    except flags.Error as e:
        sys.stderr.write(f"{name}: error: {e}\n")
        sys.exit(2)
    flags.FLAGS(argv[:1])  # absl's own flags (logging) keep their defaults
    if len(rest) > 1:
        sys.stderr.write(f"{name}: error: unexpected arguments: {' '.join(rest[1:])} (flags "
                         "are --name=value)\n")
        sys.exit(2)
    return rest


def parse_checked(script: str, argv: list[str], flag_values, help_text: str | None,
                  check: Callable):
    """absl parsing of `argv` into a script's own `flag_values`, then `check(flag_values)` (the
    script's checks, returning its config); a bad flag or value is one line on stderr,
    `<script>: error: ...`, and `SystemExit(2)`, as on the command line."""
    parse_flags(argv, flag_values, help_text)
    try:
        return check(flag_values)
    except UsageError as e:
        sys.exit(error_exit(script, e, 2))


def definer(flag_values):
    """absl's `flags.DEFINE_*` functions bound to `flag_values`, for a script's
    `define_flags(flag_values)`: `d = definer(flag_values); d.DEFINE_integer("rounds", 5, "...")`.
    The flags are registered for the module that calls them (run as a script: the script, whose
    flags absl's --helpshort lists)."""
    import functools
    import types

    from absl import flags

    return types.SimpleNamespace(**{
        name: functools.partial(getattr(flags, name), flag_values=flag_values)
        for name in dir(flags) if name.startswith("DEFINE")})


def error_exit(script: str, error: BaseException, status: int, message: str | None = None
               ) -> int:
    """Reports `error` as one line, `<script>: error: <message>` (default: the error's text), on
    stderr and returns `status`, the script's exit status (2: a bad flag; 1: a failed step).
    With TFFL_DEBUG=1 in the environment it re-raises `error` instead, traceback and all. Call
    it from the `except` block that caught `error`:

    >>> try:
    ...     at_least("rounds", 0, 1)
    ... except UsageError as e:
    ...     status = error_exit("train.py", e, 2)   # stderr: train.py: error: flag --rounds=0: ...
    >>> status
    2
    """
    if os.environ.get("TFFL_DEBUG"):
        raise error
    sys.stderr.write(f"{script}: error: {error if message is None else message}\n")
    return status


def _number_list(name: str, values: Sequence[str], kind, noun: str) -> list:
    if not values:
        raise UsageError(f"flag --{name}: give at least one value")
    out = []
    for v in values:
        try:
            out.append(kind(v))
        except ValueError:
            raise UsageError(f"flag --{name}={','.join(values)}: {v!r} is not {noun}") from None
    return out


def int_list(name: str, values: Sequence[str], unique: bool = False) -> tuple[int, ...]:
    """The integers of a list flag `--name=values`.

    Raises:
      UsageError: naming the flag, for an empty list, a value that is not an integer, or (with
        `unique`) repeated values.

    >>> int_list("clients_per_round", ["10", "5"])
    (10, 5)
    """
    out = _number_list(name, values, int, "an integer")
    if unique and len(set(out)) != len(out):
        raise UsageError(f"flag --{name}={','.join(values)}: values repeat")
    return tuple(out)


def float_list(name: str, values: Sequence[str]) -> tuple[float, ...]:
    """The numbers of a list flag `--name=values`; `UsageError` naming the flag otherwise.

    >>> float_list("communication_cost", ["0", "1.5"])
    (0.0, 1.5)
    """
    return tuple(_number_list(name, values, float, "a number"))


def at_least(name: str, value, minimum) -> None:
    """Raises `UsageError` naming `--name` unless `value >= minimum`."""
    if value < minimum:
        raise UsageError(f"flag --{name}={value}: must be >= {minimum}")


def writable_output_dir(path: os.PathLike | str, flag: str = "output_dir") -> pathlib.Path:
    """Creates `path` and proves it writable.

    Raises:
      UsageError: naming `--<flag>` and the reason, if it cannot be written.
    """
    output_dir = pathlib.Path(path)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"flag --{flag}={output_dir}: cannot write there ({e.strerror or e}); "
                         "choose a writable directory") from None
    return output_dir


def verbosity_requested(argv: Sequence[str] | None = None) -> bool:
    """Whether the command line (default `sys.argv`) sets absl's `--verbosity`/`-v`."""
    args = sys.argv[1:] if argv is None else argv
    return any(str(a).startswith(("--verbosity", "-v")) for a in args)


class _StdoutHandler(logging.Handler):
    """Writes each record to the `sys.stdout` of the moment (a test's captured one too)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001  (logging's own convention)
            self.handleError(record)


def show_progress() -> None:
    """Shows the `tffl` logger's lines (INFO and up: the setup steps as they start, the
    runtime's notes) on stdout as `tffl: <message>`, once; they do not go on to the root logger
    (absl's handler)."""
    logger = logging.getLogger("tffl")
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("tffl: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def quiet_python_logs() -> None:
    """Shows tffl's progress lines (`show_progress`), and silences Python warnings and
    TensorFlow's, absl's and matplotlib's Python loggers below ERROR (matplotlib's font cache
    logs at INFO when it is first built), unless the command line asks for verbosity
    (`verbosity_requested`)."""
    show_progress()
    if verbosity_requested():
        return
    import warnings

    import tensorflow as tf

    warnings.filterwarnings("ignore")
    tf.get_logger().setLevel(logging.ERROR)
    for name in ("absl", "matplotlib"):
        logging.getLogger(name).setLevel(logging.ERROR)


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table: `columns` are `(title, key, format)`; a missing or None value is
    blank."""

    def cell(row, key, fmt):
        value = row.get(key)
        return "" if value is None else fmt.format(value)

    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row, key, fmt) for _, key, fmt in columns) + " |"
              for row in rows]
    return "\n".join(lines)


def write_table(output_dir: os.PathLike | str, stem: str, rows: Sequence[dict],
                columns: Sequence[tuple[str, str, str]], preamble: str = "") -> str:
    """Writes `<stem>.csv` (every key of `columns`, unformatted) and `<stem>.md` (`preamble`,
    then the formatted table); returns the Markdown table."""
    output_dir = pathlib.Path(output_dir)
    with open(output_dir / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[key for _, key, _ in columns],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table = markdown_table(rows, columns)
    (output_dir / f"{stem}.md").write_text(f"{preamble}\n\n{table}\n" if preamble else
                                           f"{table}\n")
    return table


@contextlib.contextmanager
def run_directory(path: pathlib.Path | None, prefix: str = "tffl_run_"):
    """A folder for one `tffl.simulation.driver.run_rounds` run: `path` emptied first (a script without
    --resume replaces its runs when rerun into the same --output_dir, as it replaces its
    tables, instead of `run_rounds` refusing them), or a temporary folder if `path` is None."""
    if path is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield pathlib.Path(tmp)
        return
    shutil.rmtree(path, ignore_errors=True)
    yield pathlib.Path(path)


def run_settings(script: str, argv: Sequence[str], validate_flags: Callable[[], dict],
                 settings: Callable[[dict], Iterable[list[dict]]],
                 write_results: Callable[[list[dict], dict], str]) -> int:
    """The `main(argv)` of a script that runs a grid of settings on one managed TFF runtime and
    writes one table: returns its exit status.

    `validate_flags()` returns the config (with "output_dir") or raises `UsageError` (status
    2); `settings(config)` yields each setting's result rows in turn, inside
    `tffl.runtime.local_runtime` (its worker log in output_dir); `write_results(rows, config)`
    writes the files and returns the table, printed with the elapsed time. A ValueError,
    FloatingPointError or OSError while running is one line on stderr (status 1); a stray
    positional argument is absl's usage error.

    >>> def settings(config):  # one row per setting, run on a TFF worker started and stopped here
    ...     for m in config["sizes"]:
    ...         yield [{"m": m, "loss": 1 / m}]
    >>> status = run_settings(  # doctest: +ELLIPSIS
    ...     "example.py", ["example.py"], lambda: {"sizes": (2, 4), "output_dir": run_dir},
    ...     settings, lambda rows, config: markdown_table(rows, [("m", "m", "{}"),
    ...                                                          ("loss", "loss", "{:g}")]))
    <BLANKLINE>
    | m | loss |
    |---|---|
    | 2 | 0.5 |
    | 4 | 0.25 |
    <BLANKLINE>
    done in ... s; results in ...
    >>> status
    0
    """
    if len(argv) > 1:
        from absl import app

        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = validate_flags()
        from tffl import runtime

        quiet_python_logs()
        started = time.perf_counter()
        rows = []
        with runtime.local_runtime(log_dir=config["output_dir"]):
            for setting_rows in settings(config):
                rows += setting_rows
    except UsageError as e:
        return error_exit(script, e, 2)
    except (ValueError, FloatingPointError, OSError) as e:
        return error_exit(script, e, 1)
    print("\n" + write_results(rows, config) + "\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; results in {config['output_dir']}",
          flush=True)
    return 0
