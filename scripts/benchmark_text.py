r"""Times loading, tokenizing and partitioning the whole SST-2 train set into federated clients.

    uv run python scripts/benchmark_text.py --data_dir=../shared/data/sst2
    uv run python scripts/benchmark_text.py --data_dir=../shared/data/sst2 --vocab=path/vocab.txt

Without --vocab a word-level WordPiece vocabulary of the 20,000 most frequent lower-cased
training words is built first (its time is its own line). Prints one line per stage
(`tasks.benchmark_text.measure`) and a total. A bad flag or a folder without train.tsv is one
line on stderr and exit status 2; a file that cannot be read, exit status 1.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from runner import cli  # noqa: E402
from runner import tensorflow_import  # noqa: E402
from runner.cli import UsageError  # noqa: E402


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a
    FlagValues of its own in a test), registered for this module: run as a script, absl's
    --helpshort lists them."""
    d = cli.definer(flag_values)
    d.DEFINE_string("data_dir", "../shared/data/sst2", "SST-2 in GLUE's layout (train.tsv).")
    d.DEFINE_string("vocab", None, "WordPiece vocab.txt (default: build one).")
    d.DEFINE_integer("num_clients", 50, "Clients to partition into (>= 1).")
    d.DEFINE_integer("sequence_length", 64, "Tokens per example (>= 2).")
    d.DEFINE_enum("scheme", "dirichlet", ["iid", "shards", "dirichlet"], "Partition scheme.")
    d.DEFINE_float("alpha", 0.5, "Dirichlet concentration (> 0).")


def _check(fv: flags.FlagValues) -> None:
    """Checks the flags together; raises `UsageError` (one line naming the flag)."""
    cli.at_least("num_clients", fv.num_clients, 1)
    cli.at_least("sequence_length", fv.sequence_length, 2)
    if not fv.alpha > 0:
        raise UsageError(f"flag --alpha={fv.alpha}: must be > 0")
    if not (pathlib.Path(fv.data_dir) / "train.tsv").is_file():
        raise UsageError(f"flag --data_dir={fv.data_dir}: no train.tsv there (SST-2 in "
                         "GLUE's layout, e.g. ../shared/data/sst2)")


def parse(argv: list[str], flag_values: flags.FlagValues) -> None:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks them; a bad
    flag is one line on stderr and `SystemExit(2)`, as on the command line."""
    cli.parse_flags(argv, flag_values, __doc__)
    try:
        _check(flag_values)
    except UsageError as e:
        sys.stderr.write(f"benchmark_text.py: error: {e}\n")
        sys.exit(2)


def main(argv: list[str]) -> int:
    fv = flags.FLAGS
    try:
        if len(argv) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
        _check(fv)
    except UsageError as e:
        sys.stderr.write(f"benchmark_text.py: error: {e}\n")
        return 2
    from tasks import benchmark_text

    try:
        figures = benchmark_text.measure(fv.data_dir, fv.vocab, fv.num_clients,
                                         fv.sequence_length, fv.scheme, fv.alpha)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"benchmark_text.py: error: {e}\n")
        return 1
    print(benchmark_text.format_figures(figures, fv.num_clients, fv.scheme,
                                        fv.sequence_length, fv.vocab), flush=True)
    return 0


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))
