r"""RoLoRA's MNIST toy (rolora.md §2.5): RoLoRA vs FedAvg-LoRA vs FFA-LoRA, best learning rate each.

Model logits = ReLU(x·A·B)·W_out with A (784×16), B (16×784) trained and W_out fixed; MNIST-5k
(../shared/data/mnist, 4,000 train / 1,000 test) split with no overlap into 5 clients × 2 labels
and 10 clients × 1 label, every client every round, ~5 local epochs per round (60 steps of 64).
As in the paper, several learning rates are tried and the best final test accuracy of each method
is reported. Each (setting, learning rate) is one `scripts/train.py` run in
`<output_dir>/toy_<N>x<k>_lr<lr>/` (`experiments.rolora_mnist.run_toy`); a run that is already
complete there is reused, and one stopped mid-way is rerun, so the script can be stopped and
rerun.

    uv run python scripts/rolora_mnist_toy.py --output_dir=runs/rolora_mnist_toy

Writes `results.md` and `results.csv` to --output_dir and prints the table.
"""

from __future__ import annotations

import pathlib
import sys

from absl import app
from absl import flags

from experiments import cli
from experiments import rolora_mnist
from experiments.running import StepError

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/rolora_mnist_toy", "Where runs and tables go.")
_LEARNING_RATES = flags.DEFINE_list("learning_rates", "0.5,0.1,0.05", "Client learning rates tried.")
_SETTINGS = flags.DEFINE_list("settings", "5x2,10x1", "Settings NxK: N clients with K labels each.")
_ROUNDS = flags.DEFINE_integer("rounds", 60, "Communication rounds.")
_LOCAL_STEPS = flags.DEFINE_integer("local_steps", 60, "Local steps (batch 64) per round.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Folder with mnist/mnist_5k.csv.gz (the paper toy's MNIST-5k, e.g. "
    "../shared/data); default: train.py's, MNIST through TFDS.")


def main(argv: list[str]) -> int:
    try:
        if len(argv) > 1:
            raise cli.UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are "
                                 "--name=value)")
        for setting in _SETTINGS.value:
            rolora_mnist.parse_setting(setting)
        cli.at_least("rounds", _ROUNDS.value, 1)
        cli.at_least("local_steps", _LOCAL_STEPS.value, 1)
    except ValueError as e:
        sys.stderr.write(f"rolora_mnist_toy.py: error: {e}\n")
        return 2
    try:
        table = rolora_mnist.run_toy(
            pathlib.Path(_OUTPUT_DIR.value), _SETTINGS.value, _LEARNING_RATES.value,
            _ROUNDS.value, _LOCAL_STEPS.value, _DATA_DIR.value,
            log=lambda line: print(line, flush=True))
    except StepError as e:
        sys.stderr.write(f"rolora_mnist_toy.py: error: {e}\n")
        return 1
    print("\n" + table + "\n\n" + rolora_mnist.TOY_PAPER_CLAIMS)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
