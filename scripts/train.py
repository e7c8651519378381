r"""Federated training from the command line: algorithms x one task, one round loop.

The defaults run offline in about a minute on 2 CPU cores: RoLoRA vs FedAvg-LoRA vs FFA-LoRA on
RoLoRA's two-layer net ReLU(x A B) W_out (rank 16) over scikit-learn's bundled 8x8 digits (1,797
real images), split 5 clients x 2 classes, all clients every round, 100 communication rounds.

    uv run python scripts/train.py
    uv run python scripts/train.py --algorithm=rolora --num_clients=10 --classes_per_client=1
    uv run python scripts/train.py --algorithm=fedavg --partition=iid --num_clients=20 \
        --clients_per_round=10 --learning_rate=0.1 --rounds=30 --output_dir=runs/digits
    uv run python scripts/train.py --output_dir=runs/digits --resume     # continue a stopped run
    uv run python scripts/train.py --output_dir=runs/digits --evaluate_only  # re-evaluate it
    uv run python scripts/train.py --task=mnist                          # MNIST through TFDS
    uv run python scripts/train.py --task=mnist --data_dir=../shared/data  # the MNIST-5k CSV
    uv run python scripts/train.py --workers=2           # clients split over 2 TFF C++ workers
    uv run python scripts/train.py --config=runs/digits/config.json --output_dir=runs/again

Each algorithm writes to --output_dir (default: runs/<task>-<algorithms>-<time>), or to
--output_dir/<algorithm>/ when several are compared:
  metrics.csv          one row per communication round (train loss, eval, bytes down/up per
                       client, seconds; RoLoRA's rows alternate `b_round/...` and `a_round/...`)
  checkpoints/         the newest server states; --resume continues after the last one
  summary.json         final metrics and the flags used
  config.json          the run's configuration (`runner.run_config.RunConfig`):
                       `--config=<folder>/config.json` runs it again
  evaluation.json      --evaluate_only's metrics of the newest checkpoint
and a comparison of several algorithms goes to comparison.csv / comparison.md; the TFF C++
worker's own log to tff_worker.log (tff_worker_<i>.log with --workers, see docs/runtime.md).
TF/TFF log noise is off unless --verbosity is given.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from absl import app
from absl import flags

from runner import train_flags

train_flags.define(module_name=__name__)
_RUN: dict = {}


def _import_heavy() -> None:
    """TensorFlow, TFF and the modules that run them, after the flags are checked and before
    absl's app.run starts `main` (`runner.tensorflow_import`: imported inside `main`, Keras
    cannot build models)."""
    if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    from runner import tensorflow_import

    tensorflow_import.import_tensorflow()
    for module in ("runner.run", "runner.training"):  # loaded here, before the flags are read
        importlib.import_module(module)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing and every check of the flag values into the run's `RunConfig`
    (`runner.train_flags.parse`: a bad one is one line on stderr and exit status 2), then
    the heavy imports; for app.run."""
    _RUN["config"] = train_flags.parse(argv)
    _import_heavy()
    return argv[:1]


def main(argv: list[str]) -> int:
    del argv  # `_parse_flags` refused any leftover argument
    from runner import run

    return run.execute(_RUN["config"])


def run_command_line(argv: list[str]) -> int:
    """`train.py <argv[1:]>` in this process, with flags of its own (absl's global ones stay
    untouched); returns the exit status (2 after the one line of a bad flag on stderr).

    For tests and notebooks: what the command line does, without a new interpreter.
    """
    from runner import run

    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    try:
        config = train_flags.parse(argv, flag_values)
    except SystemExit as e:
        return e.code
    return run.execute(config)


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
