"""Running a `RunConfig` in this process: `run(config)` and, for command lines, `execute`.

`run(config)` checks the configuration (`runner.train_options.check`: a value that cannot
work raises `UsageError` naming its flag), writes `config.json` into every run folder, starts the
runtime (`tffl.runtime`) and runs each algorithm (`runner.training.run_algorithm`); it
returns their summaries. `execute(config)` does the same for a command line: the exit status, one
line on stderr for an error, the comparison table and the closing lines.

A crash-isolating child per run, fed by a config file:

    python -m runner.run runs/x/config.json

    >>> from runner.run_config import RunConfig
    >>> config = RunConfig().with_changes(algorithm=["fedavg_lora"], rounds=2)
    >>> summaries = run(config.with_changes(output_dir=str(tmp)))   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

from runner import cli, machine, train_options
from runner.cli import UsageError
from runner.run_config import PROVENANCE, SECTION_OF, RunConfig

CONFIG_FILE = "config.json"


# The user's data files: recorded as absolute paths, so that a run folder's config.json (what
# --resume, --config, scripts/export_adapters.py and scripts/generate.py read) names them
# from any working directory.
DATA_FILES = ("train_file", "dev_file", "test_file")


def resolve(config: RunConfig) -> RunConfig:
    """`config` checked, with its output folder resolved (a fresh runs/<task>-<algorithms>-
    <time> when unset), created and proved writable, and its data files (`DATA_FILES`) made
    absolute; `UsageError` names a bad value."""
    values = config.flag_values()
    train_options.check(values, config.changed())
    files = {name: str(pathlib.Path(config.get(name)).resolve()) for name in DATA_FILES
             if config.get(name) is not None}
    return config.with_changes(output_dir=str(train_options.output_dir(values)), **files)


def run_folders(config: RunConfig) -> list[tuple[str, pathlib.Path]]:
    """(algorithm, its run folder): the output folder, or one sub-folder per algorithm when
    several are compared."""
    output_dir, algorithms = pathlib.Path(config.output.output_dir), config.algorithm.algorithm
    return [(a, output_dir / a if len(algorithms) > 1 else output_dir) for a in algorithms]


def write_config(config: RunConfig) -> None:
    """`config.json` in the output folder and, when several algorithms are compared, in each
    algorithm's folder (its configuration: that algorithm, that folder), with the code's and
    machine's `provenance` beside the sections (`runner.machine.provenance`).

    A folder's existing config.json is kept when the run continues (`resume`, `evaluate_only`)
    or the folder holds checkpoints (the driver then refuses the run): it records how the
    folder's rounds were trained."""
    from tffl.simulation import driver

    output_dir = pathlib.Path(config.output.output_dir)
    folders = [(output_dir, config)] + [
        (folder, config.with_changes(algorithm=[a], output_dir=str(folder)))
        for a, folder in run_folders(config) if folder != output_dir]
    continuing = config.output.resume or config.output.evaluate_only
    for folder, folder_config in folders:
        path = folder / CONFIG_FILE
        if path.exists() and (continuing or (folder / driver.CHECKPOINT_DIR).exists()):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        record = folder_config.to_dict() | {PROVENANCE: machine.provenance()}
        path.write_text(json.dumps(record, indent=1) + "\n")


def rerun_command(config: RunConfig) -> str:
    """The train.py command that runs `config` again, into a fresh folder."""
    return config.with_changes(output_dir=None, resume=False, evaluate_only=False).command()


def read_config(folder: pathlib.Path) -> RunConfig:
    """The `RunConfig` a run folder recorded (`UsageError` if it has none or a malformed one)."""
    path = pathlib.Path(folder) / CONFIG_FILE
    try:
        return RunConfig.from_json(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: not found; pass the folder of a run (it holds "
                         f"{CONFIG_FILE})") from None
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None


def graph_optimization(config: RunConfig) -> str:
    """The run's `tffl.runtime.graph_optimization` choice: `config.runtime.graph_optimization`,
    or when that is None, the model's. For a decoder (`train_options.DECODERS`) "none": TFF's
    Grappler pass takes minutes over each round kind of Gemma 3 270M, and the rounds after it are
    at most 1.1 times slower without it. For the rest "tff": an encoder's round kinds compile in
    seconds either way, and its later rounds are faster with the pass (docs/PERFORMANCE.md,
    `scripts/benchmark.py --suite=targets --targets_parts=startup`).

    >>> graph_optimization(RunConfig().with_changes(backbone="gemma3_270m"))
    'none'
    >>> graph_optimization(RunConfig().with_changes(backbone="minilm"))
    'tff'
    >>> graph_optimization(RunConfig().with_changes(backbone="gemma3_270m",
    ...                                             graph_optimization="tff"))
    'tff'
    """
    if config.runtime.graph_optimization is not None:
        return config.runtime.graph_optimization
    return "none" if config.model.backbone in train_options.DECODERS else "tff"


def max_concurrent_calls(config: RunConfig) -> int | None:
    """How many clients each local TFF worker trains at once: `config.runtime.max_concurrent_calls`,
    or when that is None, the model's. For a decoder 1: each concurrent client holds its own
    copy of the frozen base and activations, so on Gemma 3 270M at N = 20 two at once peaked
    the worker at 7.7 GB against 4.0 GB one at a time (4.0 GB at N = 3 either way), with rounds
    about as long (1.1 times on a worker started by hand, shorter on the local one). For the
    rest None: one per CPU core
    (`tffl.runtime.workers.default_max_concurrent_calls`; docs/PERFORMANCE.md).

    >>> max_concurrent_calls(RunConfig().with_changes(backbone="gemma3_270m"))
    1
    >>> max_concurrent_calls(RunConfig().with_changes(backbone="minilm")) is None
    True
    >>> max_concurrent_calls(RunConfig().with_changes(backbone="gemma3_270m",
    ...                                               max_concurrent_calls=2))
    2
    """
    if config.runtime.max_concurrent_calls is not None:
        return config.runtime.max_concurrent_calls
    return 1 if config.model.backbone in train_options.DECODERS else None


def build_runtime(config: RunConfig):
    """The runtime context of `config.runtime`: in-process under a strategy
    (runtime="distribute"), else TFF workers at `worker_addresses`, else `workers` local ones
    (logging to the output folder)."""
    from tffl import runtime
    from tffl.runtime import distribute

    r = config.runtime
    if r.runtime == "distribute":
        try:
            if r.logical_cpus:
                distribute.configure_logical_cpus(r.logical_cpus)
            strategy = distribute.build_strategy(r.devices)
        except distribute.DeviceError as e:
            raise UsageError(str(e)) from None
        return distribute.distribute_runtime(strategy=strategy)
    if r.worker_addresses:
        return runtime.remote_runtime(list(r.worker_addresses), ready_timeout_s=r.worker_timeout,
                                      graph_optimization=graph_optimization(config))
    return runtime.local_runtime(log_dir=pathlib.Path(config.output.output_dir),
                                 num_workers=r.workers, ready_timeout_s=r.worker_timeout,
                                 max_concurrent_calls=max_concurrent_calls(config),
                                 graph_optimization=graph_optimization(config))


def run(config: RunConfig) -> list[dict]:
    """Runs every algorithm of `config` (see the module docstring); returns their summaries."""
    from runner import tensorflow_import, training

    tensorflow_import.check_eager_context()
    config = resolve(config)
    write_config(config)
    summaries = []
    with build_runtime(config):
        for algorithm, folder in run_folders(config):
            summaries.append(training.run_algorithm(algorithm, folder, config))
    return summaries


def evaluate_untrained(config: RunConfig) -> dict:
    """`config`'s task evaluated on its first algorithm's untrained model (the zero-shot row:
    `runner.training.evaluate_untrained`), in this process; returns the summary it writes
    into the output folder."""
    from runner import tensorflow_import, training

    tensorflow_import.check_eager_context()
    config = resolve(config)
    write_config(config)
    with build_runtime(config):
        return training.evaluate_untrained(config.algorithm.algorithm[0],
                                           pathlib.Path(config.output.output_dir), config)


def interrupted_message(config: RunConfig) -> str:
    """One line for Ctrl-C: the last checkpointed round of each algorithm and the command that
    continues the run."""
    from tffl.simulation import checkpoint, driver

    if config.output.output_dir is None:
        return "interrupted before the run started; nothing to resume"
    output_dir = pathlib.Path(config.output.output_dir)
    done = []
    for folder in sorted(output_dir.rglob(driver.CHECKPOINT_DIR)):
        found = checkpoint.latest(folder)
        if found is not None:
            name = folder.parent.name if folder.parent != output_dir else ""
            done.append(f"{name + ' ' if name else ''}round {found[0]}")
    if not done:
        return (f"interrupted before the first checkpoint in {output_dir}; rerun to start "
                "again")
    return (f"interrupted; checkpointed: {', '.join(done)}; continue with: "
            f"{config.with_changes(resume=False).command()} --resume")


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

    from tffl.runtime import workers

    gc.collect()
    workers.stop_all_workers()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def flag_message(error: BaseException) -> str:
    """A library error's message with the run's parameters it names written as the flags that
    set them: `name=value` -> `--name=value` (`--name`/`--noname` for True/False) and
    `` `name` `` -> `--name`, for the fields of `RunConfig`; flag names appear in this command-line
    layer only.

    >>> flag_message(ValueError("use project_shortcut=False; or choose another `output_dir`"))
    'use --noproject_shortcut; or choose another --output_dir'
    >>> flag_message(ValueError("rank=65: must be <= 64 (nope=1 is kept)"))
    '--rank=65: must be <= 64 (nope=1 is kept)'
    """
    def as_flag(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        if name not in SECTION_OF:
            return match.group(0)
        return {"True": f"--{name}", "False": f"--no{name}"}.get(value, f"--{name}={value}")

    message = re.sub(r"(?<![-\w./])([a-z][a-z0-9_]*)=([^\s,;)]+)", as_flag, str(error))
    return re.sub(r"`([a-z][a-z0-9_]*)`",
                  lambda m: f"--{m.group(1)}" if m.group(1) in SECTION_OF else m.group(0),
                  message)


def execute(config: RunConfig, script: str = "train.py") -> int:
    """`run(config)` for a command line: returns the exit status (0; 2 for a value that cannot
    work or a run that does not match its checkpoint; 1 for a failed run; 3 for a lost TFF
    worker), with one line `<script>: error: ...` on stderr for an error; prints the comparison
    of several algorithms and one line per algorithm. Ctrl-C ends the process (status 130) after
    one line naming the command that continues the run."""
    from models.checkpoints import CheckpointUnavailableError
    from tffl.runtime import worker_connection
    from tffl.simulation import checkpoint, driver

    try:
        cli.quiet_python_logs()
        config = resolve(config)
        summaries = run(config)
    except (UsageError, driver.ResumeError, checkpoint.CheckpointMismatchError) as e:
        return cli.error_exit(script, e, 2, flag_message(e))
    except (ValueError, FloatingPointError, OSError, CheckpointUnavailableError) as e:
        # CheckpointUnavailableError: a pretrained backbone (MiniLM, Gemma 3) could not be
        # downloaded or extracted; its message names the package.
        return cli.error_exit(script, e, 1, flag_message(e))
    except worker_connection.WorkerError as e:
        output_dir = config.output.output_dir
        resumable = output_dir is not None and any(
            pathlib.Path(output_dir).rglob(driver.CHECKPOINT_DIR))
        return cli.error_exit(script, e, 3, f"{e}" + (
            f"; the completed rounds are checkpointed in {output_dir}: rerun with the same flags "
            "and --resume to continue" if resumable else ""))
    except KeyboardInterrupt:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"{script}: {interrupted_message(config)}\n")
        exit_after_interrupt(130)
    report(config, summaries)
    return 0


def report(config: RunConfig, summaries: list[dict]) -> None:
    """The comparison table of several algorithms, and one line per algorithm."""
    from runner import comparison
    from tasks.run_task import counted

    output_dir, task = pathlib.Path(config.output.output_dir), config.task.task
    if len(summaries) > 1:
        # The command that reruns the comparison, from the folder's config.json (`write_config`).
        rerun = (f"Rerun: `{rerun_command(read_config(output_dir))}`"
                 if (output_dir / CONFIG_FILE).exists() else "")
        table = comparison.write_comparison(output_dir, summaries, task, config.output.eval_test,
                                            preamble=rerun)
        print("\n" + table + "\n", flush=True)
    held_out = comparison.eval_split(summaries, task)
    for summary in summaries:
        final = summary["final"]
        print(
            "done: {} {}; train loss {:.4f}; {}; {:.1f} s.".format(
                summary["algorithm"],
                counted(summary["communication_rounds"], "communication round"),
                final.get("train_loss", float("nan")),
                comparison.final_eval(final, held_out),
                summary["wall_seconds_this_run"],
            ),
            flush=True,
        )
    print(f"Results in {output_dir}", flush=True)


def main(argv: list[str]) -> int:
    """`python -m runner.run CONFIG.json`: runs the configuration a file holds."""
    if len(argv) != 2:
        sys.stderr.write("usage: python -m runner.run CONFIG.json\n")
        return 2
    try:
        config = RunConfig.from_json(pathlib.Path(argv[1]).read_text())
    except (OSError, ValueError) as e:
        return cli.error_exit("runner.run", UsageError(f"{argv[1]}: {e}"), 2)
    return execute(config, script="runner.run")


if __name__ == "__main__":
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    sys.exit(main(sys.argv))
