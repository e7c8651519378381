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

Each algorithm writes to --output_dir (default: runs/<task>-<algorithms>-<time>), or to
--output_dir/<algorithm>/ when several are compared:
  metrics.csv          one row per communication round (train loss, eval, bytes down/up per
                       client, seconds; RoLoRA's rows alternate `b_round/...` and `a_round/...`)
  checkpoints/         the newest server states; --resume continues after the last one
  summary.json         final metrics and the flags used
  evaluation.json      --evaluate_only's metrics of the newest checkpoint
and a comparison of several algorithms goes to comparison.csv / comparison.md; the TFF C++
worker's own log to tff_worker.log (tff_worker_<i>.log with --workers, see docs/runtime.md).
TF/TFF log noise is off unless --verbosity is given.
"""

from __future__ import annotations

import os
import pathlib
import sys
import warnings

from absl import app
from absl import flags

from experiments import cli
from experiments import train_flags
from experiments.cli import UsageError

# The flags (experiments.train_flags) are parsed and checked before TensorFlow, TFF or any module
# of this project that imports them is imported (`_parse_flags`): --help or a bad flag is answered
# in a second, the work then needs the import of `_import_heavy`.
train_flags.define(module_name=__name__)
# The run directory `_parse_flags` resolved (and created) from --output_dir.
_RUN: dict[str, pathlib.Path] = {}


def _options() -> dict:
    """Every flag's value by name, and whether --rank was given (`experiments.training`)."""
    return train_flags.options(_RUN.get("flag_values", flags.FLAGS))


def _import_heavy() -> None:
    """TensorFlow, TFF and the modules that run them, after the flags are checked and before
    absl's app.run starts `main`: imported inside `main`, Keras 2 builds layers on graph tensors
    instead of KerasTensors and `tf.keras.Sequential` fails. `tffl.runtime` comes right after
    TensorFlow, so that its exit hook (which stops any TFF worker) is installed on every exit
    path."""
    # Quiet TensorFlow's C++ logs before it is imported, unless the user asked for verbosity.
    if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    import tensorflow  # noqa: F401

    from tffl import runtime  # noqa: F401

    from experiments import comparison  # noqa: F401
    from experiments import training  # noqa: F401


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing and every check of the flag values (`experiments.train_flags.parse`: a bad
    one is one line on stderr and exit status 2), then the heavy imports; for app.run."""
    _RUN["output_dir"] = train_flags.parse(argv)
    _import_heavy()
    return argv[:1]


def _runtime(output_dir: pathlib.Path):
    """The runtime of the flags: in-process under a strategy (--runtime=distribute), else TFF
    workers at --worker_addresses, else --workers local ones."""
    from tffl import runtime

    options = _options()
    if options["runtime"] == "distribute":
        try:
            if options["logical_cpus"]:
                runtime.configure_logical_cpus(options["logical_cpus"])
            strategy = runtime.build_strategy(options["devices"])
        except runtime.DeviceError as e:
            raise UsageError(str(e)) from None
        return runtime.distribute_runtime(strategy=strategy)
    if options["worker_addresses"]:
        return runtime.remote_runtime(options["worker_addresses"],
                                      ready_timeout_s=options["worker_timeout"])
    return runtime.local_runtime(log_dir=output_dir, num_workers=options["workers"],
                                 ready_timeout_s=options["worker_timeout"])


def run(output_dir: pathlib.Path) -> list[dict]:
    """Runs every algorithm of --algorithm (each in its own sub-directory when there are several)
    on the TFF workers of `_runtime`; returns their summaries."""
    from experiments import training

    algorithms = _options()["algorithm"]
    summaries = []
    with _runtime(output_dir):
        for algorithm in algorithms:
            run_dir = output_dir / algorithm if len(algorithms) > 1 else output_dir
            summaries.append(training.run_algorithm(algorithm, run_dir, _options()))
    return summaries


def resume_command(output_dir: pathlib.Path) -> str:
    """This invocation's command with --output_dir set and --resume added."""
    import shlex

    argv = _RUN.get("argv", sys.argv)
    args = [a for a in argv[1:] if not a.startswith(("--output_dir", "--resume", "--noresume"))]
    return shlex.join(["python", "scripts/train.py", *args, f"--output_dir={output_dir}",
                       "--resume"])


def interrupted_message(output_dir: pathlib.Path | None) -> str:
    """One line for Ctrl-C: the last checkpointed round of each algorithm and the command that
    continues the run."""
    from tffl.simulation import checkpoint
    from tffl.simulation import driver as simulation

    if output_dir is None:
        return "interrupted before the run started; nothing to resume"
    done = []
    for folder in sorted(output_dir.rglob(simulation.CHECKPOINT_DIR)):
        found = checkpoint.latest(folder)
        if found is not None:
            name = folder.parent.name if folder.parent != output_dir else ""
            done.append(f"{name + ' ' if name else ''}round {found[0]}")
    if not done:
        return (f"interrupted before the first checkpoint in {output_dir}; rerun to start "
                "again")
    return (f"interrupted; checkpointed: {', '.join(done)}; continue with: "
            f"{resume_command(output_dir)}")


def exit_after_interrupt(status: int) -> None:
    """Ends the process after Ctrl-C without Python's interpreter teardown.

    By now every completed round is checkpointed and the TFF workers are stopped. TFF's
    event-loop threads (daemon threads of `AsyncThreadRunner`) may still be inside the
    interrupted computation's gRPC call; when such a thread wants the GIL back during teardown,
    Python ends it with `pthread_exit`, whose unwinding through gRPC's C++ frames sometimes
    aborts the process ("terminate called ...", "Fatal Python error: Aborted") after the one-line
    message. So: free the run's objects (TensorBoard's file writer flushes when deleted), stop
    any worker left, flush the streams and exit."""
    import gc
    import logging

    from tffl import runtime

    gc.collect()
    runtime.stop_all_workers()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str]) -> int:
    del argv  # `_parse_flags` refused any leftover argument
    from tffl import runtime
    from tffl.simulation import checkpoint
    from tffl.simulation import driver as simulation

    output_dir = _RUN["output_dir"]
    interrupted = False
    try:
        cli.quiet_python_logs()
        summaries = run(output_dir)
    except (UsageError, simulation.ResumeError, checkpoint.CheckpointMismatchError) as e:
        return cli.error_exit("train.py", e, 2)
    except (ValueError, FloatingPointError, OSError) as e:
        return cli.error_exit("train.py", e, 1)
    except runtime.WorkerError as e:
        resumable = output_dir is not None and any(output_dir.rglob(simulation.CHECKPOINT_DIR))
        return cli.error_exit("train.py", e, 3, f"{e}" + (
            f"; the completed rounds are checkpointed in {output_dir}: rerun with the same flags "
            "and --resume to continue" if resumable else ""))
    except KeyboardInterrupt:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"train.py: {interrupted_message(output_dir)}\n")
        interrupted = True
    if interrupted:
        exit_after_interrupt(130)
    _report(output_dir, summaries)
    return 0


def _report(output_dir: pathlib.Path, summaries: list[dict]) -> None:
    """The comparison table of several algorithms, and one line per algorithm."""
    from experiments import comparison
    from tasks import registry

    task, eval_test = _options()["task"], _options()["eval_test"]
    if len(summaries) > 1:
        table = comparison.write_comparison(output_dir, summaries, task, eval_test)
        print("\n" + table + "\n", flush=True)
    for summary in summaries:
        final = summary["final"]
        print(
            "done: {} {}; train loss {:.4f}; {}; {:.1f} s.".format(
                summary["algorithm"],
                registry.counted(summary["communication_rounds"], "communication round"),
                final.get("train_loss", float("nan")),
                comparison.final_eval(final, comparison.held_out_name(task)),
                summary["wall_seconds_this_run"],
            ),
            flush=True,
        )
    print(f"Results in {output_dir}", flush=True)


def run_command_line(argv: list[str]) -> int:
    """`train.py <argv[1:]>` in this process, with flags of its own (absl's global ones stay
    untouched); returns the exit status (2 after the one line of a bad flag on stderr).

    For tests and notebooks: what the command line does, without a new interpreter.
    """
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    try:
        output_dir = train_flags.parse(argv, flag_values)
    except SystemExit as e:
        return e.code
    _RUN.update(output_dir=output_dir, flag_values=flag_values, argv=list(argv))
    try:
        return main(argv[:1])
    finally:
        _RUN.clear()


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
