r"""Records a rerun of a finished train.py run in the run's summary.json, for metrics it lacks.

A finished run keeps no checkpoint in an experiment's archive (`reproduce.py --archive_dir`), so a
metric added after it ran (FedSA-LoRA's personalized test accuracy) cannot come from
`train.py --evaluate_only`. Run it again with the same flags and seed into another folder, then

    python scripts/attach_rerun.py --run=docs/runs/sst2_clients-full/fedsa_lora/N3/seed0/lr0.3 \
        --rerun=runs/fedsa_seed0_rerun/N3

The run's own figures are left as they are; its summary.json gets `rerun` (the rerun's final
metrics, wall time and the largest difference of the metrics both report) and its folder the
rerun's metrics as `metrics_rerun.csv` (`runner.archive.attach_rerun`). `reproduce.py`'s
SST-2 tables take a figure from the rerun only where the run lacks it, and say so in a note.
A rerun on the run's machine repeats it bit for bit; on a machine with another CPU it agrees to
float rounding (`runner.machine`), so the difference is recorded, with the rerun's
`machine`.
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags

from runner import archive, cli, machine


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a FlagValues of
    its own in a test), registered for this module: run as a script, absl's --helpshort lists
    them."""
    d = cli.definer(flag_values)
    d.DEFINE_string("run", None, "The finished run's folder (its summary.json).")
    d.DEFINE_string("rerun", None, "The rerun's folder: same flags and seed, finished.")


def attach(flag_values: flags.FlagValues) -> int:
    """Attaches the rerun of parsed `flag_values` (`define_flags`' flags) and prints the report;
    returns the exit status: 2 for a missing flag, 1 for a rerun it refuses, one line on stderr
    each."""
    try:
        for name, what in (("run", "finished run's folder"), ("rerun", "rerun's folder")):
            if not flag_values[name].value:
                raise cli.UsageError(f"flag --{name} is required: the {what}")
        summary = archive.attach_rerun(pathlib.Path(flag_values.run),
                                       pathlib.Path(flag_values.rerun))
    except cli.UsageError as e:
        return cli.error_exit("attach_rerun.py", e, 2)
    except (ValueError, OSError) as e:
        return cli.error_exit("attach_rerun.py", e, 1)
    rerun = summary[archive.RERUN]
    added = sorted(k for k in rerun["final"] if k not in summary["final"])
    differ = machine.differences(summary.get("machine"), rerun.get("machine"))
    print(json.dumps({"run": flag_values.run, "rerun metrics the run lacks": added,
                      "max_abs_difference_of_shared_metrics":
                          rerun["max_abs_difference_of_shared_metrics"],
                      # Another CPU rounds differently (runner.machine).
                      "machine": "not recorded for both" if differ is None
                      else "the same" if not differ else f"differs in {', '.join(differ)}"},
                     indent=1))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return attach(flags.FLAGS)


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main)
