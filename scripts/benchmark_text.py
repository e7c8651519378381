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

from experiments import cli  # noqa: E402
from experiments.cli import UsageError  # noqa: E402

_DATA_DIR = flags.DEFINE_string("data_dir", "../shared/data/sst2",
                                "SST-2 in GLUE's layout (train.tsv).")
_VOCAB = flags.DEFINE_string("vocab", None, "WordPiece vocab.txt (default: build one).")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 50, "Clients to partition into (>= 1).")
_SEQUENCE_LENGTH = flags.DEFINE_integer("sequence_length", 64, "Tokens per example (>= 2).")
_SCHEME = flags.DEFINE_enum("scheme", "dirichlet", ["iid", "shards", "dirichlet"],
                            "Partition scheme.")
_ALPHA = flags.DEFINE_float("alpha", 0.5, "Dirichlet concentration (> 0).")


def main(argv: list[str]) -> int:
    try:
        if len(argv) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
        cli.at_least("num_clients", _NUM_CLIENTS.value, 1)
        cli.at_least("sequence_length", _SEQUENCE_LENGTH.value, 2)
        if not _ALPHA.value > 0:
            raise UsageError(f"flag --alpha={_ALPHA.value}: must be > 0")
        if not (pathlib.Path(_DATA_DIR.value) / "train.tsv").is_file():
            raise UsageError(f"flag --data_dir={_DATA_DIR.value}: no train.tsv there (SST-2 in "
                             "GLUE's layout, e.g. ../shared/data/sst2)")
    except UsageError as e:
        sys.stderr.write(f"benchmark_text.py: error: {e}\n")
        return 2
    from tasks import benchmark_text

    try:
        figures = benchmark_text.measure(_DATA_DIR.value, _VOCAB.value, _NUM_CLIENTS.value,
                                         _SEQUENCE_LENGTH.value, _SCHEME.value, _ALPHA.value)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"benchmark_text.py: error: {e}\n")
        return 1
    print(benchmark_text.format_figures(figures, _NUM_CLIENTS.value, _SCHEME.value,
                                        _SEQUENCE_LENGTH.value, _VOCAB.value), flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
