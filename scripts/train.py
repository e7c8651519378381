r"""Federated training from the command line: one algorithm, one task, one round loop.

The defaults run offline in about a minute on 2 CPU cores: FedAvg of a small MLP on scikit-learn's
bundled 8x8 digits (1,797 real images), split IID over 20 clients, 10 per round, 30 rounds.

    uv run python scripts/train.py
    uv run python scripts/train.py --rounds=50 --learning_rate=0.1 --output_dir=runs/digits
    uv run python scripts/train.py --output_dir=runs/digits --resume     # continue a stopped run
    uv run python scripts/train.py --task=mnist --partition=shards --classes_per_client=2

Each run writes to --output_dir (default: runs/<task>-<algorithm>-<time>):
  metrics.csv          one row per round (train loss/accuracy, eval, bytes per client, seconds)
  checkpoints/         the newest server states; --resume continues after the last one
  summary.json         final metrics and the flags used
  tff_worker.log       the TFF C++ worker's own log
TF/TFF log noise is off unless --verbosity is given (e.g. --verbosity=1).
"""

from __future__ import annotations

import os
import sys

import warnings

# Quiet TensorFlow's C++ logs before it is imported, unless the user asked for verbosity.
if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

# TensorFlow must be imported before absl's app.run starts `main`: imported inside `main`, Keras 2
# builds layers on graph tensors instead of KerasTensors and `tf.keras.Sequential` fails.
import tensorflow as tf  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

# Imported first so its exit hook (which stops any TFF worker) is installed on every exit path.
from tffl import runtime  # noqa: E402, F401

from scripts import registry  # noqa: E402

ALGORITHMS = ("fedavg",)
_DEFAULT_DATA_DIR = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"

_ALGORITHM = flags.DEFINE_enum("algorithm", "fedavg", ALGORITHMS, "Federated algorithm.")
_TASK = flags.DEFINE_enum(
    "task", "digits", registry.TASKS,
    "Task: digits (sklearn, bundled) or mnist (MNIST-5k CSV under --data_dir).",
)
_PARTITION = flags.DEFINE_enum(
    "partition", "iid", registry.PARTITIONS,
    "Client split: iid, shards (--classes_per_client classes each), dirichlet (--dirichlet_alpha).",
)
_CLASSES_PER_CLIENT = flags.DEFINE_integer("classes_per_client", 2, "Classes per client (shards).")
_DIRICHLET_ALPHA = flags.DEFINE_float("dirichlet_alpha", 0.5, "Dirichlet concentration (dirichlet).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", str(_DEFAULT_DATA_DIR), "Folder of the real data sets (mnist/mnist_5k.csv.gz)."
)
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 20, "Clients the data is split over.")
_CLIENTS_PER_ROUND = flags.DEFINE_integer("clients_per_round", 10, "Clients sampled per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 30, "Communication rounds.")
_LOCAL_STEPS = flags.DEFINE_integer("local_steps", 10, "Local SGD steps per client per round.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "Client batch size.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.1, "Client learning rate.")
_SERVER_LEARNING_RATE = flags.DEFINE_float("server_learning_rate", 1.0, "Server learning rate.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for data split, model init and client sampling.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", 5, "Evaluate on the test set every this many rounds (0: only at the end)."
)
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 1, "Checkpoint every N rounds.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Run directory (default: runs/<task>-<algorithm>-<time>)."
)
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --output_dir from its checkpoint.")

# Flags that name a run's math; --resume refuses a checkpoint written with other values.
_RUN_FLAGS = (
    "algorithm", "task", "partition", "classes_per_client", "dirichlet_alpha", "num_clients", "clients_per_round", "local_steps", "batch_size",
    "learning_rate", "server_learning_rate", "seed",
)


class UsageError(ValueError):
    """A flag value that cannot work; reported as one line, exit status 2."""


def _positive(name: str, minimum: int = 1) -> None:
    value = flags.FLAGS[name].value
    if value < minimum:
        raise UsageError(f"flag --{name}={value}: must be >= {minimum}")


def _validate_flags() -> pathlib.Path:
    """Checks flag values together; returns the (created, writable) output directory."""
    for name in ("num_clients", "clients_per_round", "rounds", "local_steps", "batch_size",
                 "checkpoint_every", "classes_per_client"):
        _positive(name)
    _positive("eval_every", minimum=0)
    for name in ("learning_rate", "server_learning_rate", "dirichlet_alpha"):
        if not flags.FLAGS[name].value > 0:
            raise UsageError(f"flag --{name}={flags.FLAGS[name].value}: must be > 0")
    if _CLIENTS_PER_ROUND.value > _NUM_CLIENTS.value:
        raise UsageError(
            f"flag --clients_per_round={_CLIENTS_PER_ROUND.value}: must be <= "
            f"--num_clients={_NUM_CLIENTS.value}"
        )
    if _OUTPUT_DIR.value:
        output_dir = pathlib.Path(_OUTPUT_DIR.value)
    elif _RESUME.value:
        raise UsageError("flag --resume needs --output_dir naming the run to continue")
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_dir = pathlib.Path("runs") / f"{_TASK.value}-{_ALGORITHM.value}-{stamp}"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"flag --output_dir={output_dir}: cannot write there ({e.strerror or e}); "
            "choose a writable directory"
        ) from None
    return output_dir


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, but a bad value is one line on stderr and exit status 2 (no traceback)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        sys.stderr.write(f"{pathlib.Path(argv[0]).name}: error: {e}\n")
        sys.exit(2)


def _quiet_python_logs() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)


def run(output_dir: pathlib.Path) -> dict:
    """Builds the task and algorithm from the flags and runs the round loop; returns the summary."""
    from tffl import simulation

    tf.keras.utils.set_random_seed(_SEED.value)
    config = {name: flags.FLAGS[name].value for name in _RUN_FLAGS}
    task = registry.build_task(
        _TASK.value,
        num_clients=_NUM_CLIENTS.value,
        batch_size=_BATCH_SIZE.value,
        local_steps=_LOCAL_STEPS.value,
        seed=_SEED.value,
        partition=_PARTITION.value,
        classes_per_client=_CLASSES_PER_CLIENT.value,
        dirichlet_alpha=_DIRICHLET_ALPHA.value,
        data_dir=_DATA_DIR.value,
    )
    print(
        f"tffl: {_ALGORITHM.value} on {task.description}; {_NUM_CLIENTS.value} clients, "
        f"{_CLIENTS_PER_ROUND.value} per round, {_ROUNDS.value} rounds -> {output_dir}",
        flush=True,
    )
    started = time.perf_counter()
    with runtime.local_runtime(log_dir=output_dir):
        process = registry.build_algorithm(
            _ALGORITHM.value,
            task,
            client_learning_rate=_LEARNING_RATE.value,
            server_learning_rate=_SERVER_LEARNING_RATE.value,
        )
        result = simulation.run_rounds(
            process,
            sampler=registry.build_sampler(task, _CLIENTS_PER_ROUND.value, _SEED.value),
            client_dataset_fn=task.client_dataset_fn,
            rounds=_ROUNDS.value,
            output_dir=output_dir,
            evaluate_fn=lambda state: task.evaluate(process.get_model_weights(state)),
            eval_every=_EVAL_EVERY.value,
            checkpoint_every=_CHECKPOINT_EVERY.value,
            config=config,
            resume=_RESUME.value,
            log=lambda line: print(line, flush=True),
        )
    last = result.history[-1] if result.history else {}
    summary = {
        "flags": config | {"rounds": _ROUNDS.value},
        "rounds_completed": last.get("round", 0),
        "final": {k: v for k, v in last.items() if k not in simulation.TIMING_COLUMNS},
        "wall_seconds_this_run": time.perf_counter() - started,
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from tffl import checkpoint
    from tffl import simulation

    try:
        output_dir = _validate_flags()
        if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
            _quiet_python_logs()
        summary = run(output_dir)
    except (UsageError, simulation.ResumeError, checkpoint.CheckpointMismatchError) as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"train.py: error: {e}\n")
        return 2
    except (ValueError, FloatingPointError, OSError) as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"train.py: error: {e}\n")
        return 1
    final = summary["final"]
    print(
        "done: {} rounds; train loss {:.4f}, train accuracy {:.4f}; test loss {:.4f}, "
        "test accuracy {:.4f}; {:.1f} s. Results in {}".format(
            summary["rounds_completed"],
            final.get("train_loss", float("nan")),
            final.get("train_accuracy", float("nan")),
            final.get("eval_loss", float("nan")),
            final.get("eval_accuracy", float("nan")),
            summary["wall_seconds_this_run"],
            output_dir,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
