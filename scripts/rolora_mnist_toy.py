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

from absl import app, flags

from experiments import rolora_mnist
from runner import cli, tensorflow_import
from runner.running import StepError


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a FlagValues of
    its own in a test), registered for this module: run as a script, absl's --helpshort lists
    them."""
    d = cli.definer(flag_values)
    d.DEFINE_string("output_dir", "runs/rolora_mnist_toy", "Where runs and tables go.")
    d.DEFINE_list("learning_rates", "0.5,0.1,0.05", "Client learning rates tried.")
    d.DEFINE_list("settings", "5x2,10x1", "Settings NxK: N clients with K labels each.")
    d.DEFINE_integer("rounds", 60, "Communication rounds.")
    d.DEFINE_integer("local_steps", 60, "Local steps (batch 64) per round.")
    d.DEFINE_string(
        "data_dir", None, "Folder with mnist/mnist_5k.csv.gz (the paper toy's MNIST-5k, e.g. "
        "../shared/data); default: train.py's, MNIST through TFDS.")


def _check(fv: flags.FlagValues) -> None:
    """Checks the flags; raises ValueError (`cli.UsageError` among them) naming the flag."""
    for setting in fv.settings:
        rolora_mnist.parse_setting(setting)
    cli.at_least("rounds", fv.rounds, 1)
    cli.at_least("local_steps", fv.local_steps, 1)


def parse(argv: list[str], flag_values: flags.FlagValues) -> None:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks them; a bad
    flag is one line on stderr and `SystemExit(2)`, as on the command line."""
    cli.parse_flags(argv, flag_values, __doc__)
    try:
        _check(flag_values)
    except ValueError as e:
        sys.stderr.write(f"rolora_mnist_toy.py: error: {e}\n")
        sys.exit(2)


def main(argv: list[str]) -> int:
    fv = flags.FLAGS
    try:
        if len(argv) > 1:
            raise cli.UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are "
                                 "--name=value)")
        _check(fv)
    except ValueError as e:
        sys.stderr.write(f"rolora_mnist_toy.py: error: {e}\n")
        return 2
    try:
        table = rolora_mnist.run_toy(
            pathlib.Path(fv.output_dir),
            rolora_mnist.ToySweep(fv.settings, fv.learning_rates, fv.rounds, fv.local_steps,
                                  fv.data_dir),
            log=lambda line: print(line, flush=True))
    except StepError as e:
        sys.stderr.write(f"rolora_mnist_toy.py: error: {e}\n")
        return 1
    print("\n" + table + "\n\n" + rolora_mnist.TOY_PAPER_CLAIMS)
    return 0


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))
