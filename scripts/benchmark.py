r"""Performance of tffl's TFF processes against a plain TensorFlow loop doing the same client work.

    python scripts/benchmark.py          # tiny BERT, 5 and 20 clients: 3-6 min on 2 CPU cores
    python scripts/benchmark.py --backbones=small --clients_per_round=10 --local_steps=20 \
        --jit_compile                    # the overhead target's setting
    python scripts/benchmark.py --clients_per_round=10,50,100,200 --algorithms=fedavg_lora
    python scripts/benchmark.py --suite=targets --output_dir=DIR   # the performance targets
                                         # (benchmarks/targets.py; about 40 min)

docs/PERFORMANCE.md has the figures and what dominates the time.

Everything is measured in one process and one run, so that the ratios are fair on a noisy machine.
For each backbone × algorithm × clients-per-round n ("a configuration"):

* **TFF**: the tffl process (`tffl.algorithms.lora_fl.build_lora_process` for `rolora` / `fedavg_lora`,
  `tffl.algorithms.personalized.build_personalized_process("fedrep", …)` with LoRA adapters as the shared
  representation and the classifier head personal), run by `tffl.simulation.driver.run_rounds` (the one
  round driver: `FullParticipation` over the n clients, the pre-built datasets, FedRep's heads in
  its personal-state store, one metrics row per communication round in
  <output_dir>/tff_runs/<backbone>_<algorithm>_<n>/metrics.csv, no TensorBoard, one checkpoint
  after the last round) on a fresh managed TFF C++ worker (`tffl.runtime.local_runtime`, one per
  configuration, so its peak memory is its own). A benchmark round is one round of the algorithm
  = one `process.next` per communication round (RoLoRA: a B round then an A round, two rows).
* **plain**: the same client work without TFF: one eager Keras model and the engine's own
  client loop, `tffl.engine.client_training.build_phased_loop` (assign the broadcast weights, SGD phase
  by phase on the same variables with the same learning rate and loss, one pass over the same
  batches), called as a `tf.function` in this process for the n clients one after the other, then the same example-weighted average of
  the uploaded deltas in numpy. It starts from the TFF process's initial weights, so after every
  round its global weights equal the TFF process's up to float32 rounding; `max_weight_diff` in
  benchmark.json checks that it is the same computation.
* **plain (XLA)**, with `--jit_compile`: the plain loop with its SGD step compiled by XLA
  (`tf.function(jit_compile=True)`).
* **plain (no feature cache)**, for an algorithm with a phase of more than one epoch (FedRep
  with `--head_epochs` > 1): the plain loop with `Phase(cache_features=False)`, so its head
  epochs run the whole model instead of the cached features (`tffl.engine.feature_cache`);
  `feature_cache_speedup` = its s/round ÷ plain s/round (the table's "head cache gain").

The TFF and plain rounds alternate (TFF round t, plain round t, XLA round t, …: run_rounds'
`after_round` callback runs the plain rounds after each benchmark round's last communication
round), so a slow phase of the machine hits both. Round 1 (tracing, TFF compilation, XLA
compilation) is reported apart; the per-round times are means over rounds 2..R. Reported per
configuration:

* s/round of each path and the **TFF overhead ratio** = TFF s/round ÷ plain s/round. TFF's wall
  time of a round is the sum of run_rounds' `round_seconds` over its communication rounds: the
  `next` calls alone (for FedRep including the store's look-up and write-back of the round's
  personal states around `next`), not the driver's bookkeeping. That bookkeeping is in
  `tff_driver_round_seconds` (benchmark.json): the wall time from run_rounds' first dataset
  request of the round to its `after_round` callback;
* bytes down / up per client per benchmark round (RoLoRA's is a B round and an A round), read off
  the processes' TFF types (`traffic_per_communication_round`, `.traffic`; run_rounds' rows
  carry the same figures per communication round, checked to agree), and the bytes the plain
  loop actually moved (numpy `nbytes`), in benchmark.json;
* peak resident memory (RSS, sampled every 10 ms with psutil): of this Python process and of the
  TFF worker process, during the TFF rounds, and of this process during the plain rounds;
* CPU seconds per round of this process and of the worker. Like peak memory and the counters,
  the TFF figures are taken over the same span as `tff_driver_round_seconds`, so they include
  run_rounds' bookkeeping around `next`: handing the state and data in and the output apart,
  a metrics row (metrics flattened, metrics.csv rewritten), no TensorBoard, and in round R only
  the one checkpoint (the state, and FedRep's personal states, to disk);
* traces: Python traces of the plain client loop's `tf.function` (its tracing count), and
  for TFF the calls of the Keras model function (TFF re-traces a computation only by running its
  Python again) and of TFF's compiler (`desugar_and_transform_to_native`, cached per context), per
  round; "retraces after round 2" must be 0.

`--profile` additionally runs one more TFF round and one more plain round of every configuration
under cProfile (not timed; TFF's work is profiled on its event-loop thread) and writes the top
functions to <output_dir>/profiles/. That TFF round calls `process.next` directly, after
run_rounds has finished: it is a single profiled round, not part of the benchmark's round loop.

Writes <output_dir>/benchmark.json (every number, per round) and benchmark.md (the flags and the
printed table); the TFF worker's log goes to <output_dir>/tff_worker.log and run_rounds' output
to <output_dir>/tff_runs/ (replaced by a rerun). A bad flag is one line on stderr and exit
status 2 (TFFL_DEBUG=1 re-raises).
"""

from __future__ import annotations

import os
import sys
import warnings

# Quiet TensorFlow's C++ logs before it is imported, unless the user asked for verbosity.
if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import math  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from benchmarks import baseline  # noqa: E402
from benchmarks.config import (  # noqa: E402
    BACKBONES, BENCHMARKED_ALGORITHMS, PEER_MODELS, STARTUP_MODELS, TARGETS_PARTS, XLA_SUFFIX,
    BenchmarkConfig)
from runner import cli  # noqa: E402
from runner import tensorflow_import  # noqa: E402
from runner.cli import UsageError  # noqa: E402

# TensorFlow and TFF (through benchmarks.run) are imported by `_parse_flags` once the
# flags are valid, so that a bad flag fails in about a second instead of after TFF's import.


# ------------------------------------------------------------------------------------------------
# Flags -> BenchmarkConfig

# The flags live in their own FlagValues, so that this module can be imported beside other
# scripts that define flags of the same names (e.g. --rank in scripts/srpfl_speedup.py).
FLAGS = flags.FlagValues()
_BACKBONES = flags.DEFINE_list(
    "backbones", "tiny", "Backbone shapes (random weights): " + "; ".join(
        f"{s.name} ({s.describe()})" for s in BACKBONES.values()) + ".", flag_values=FLAGS)
_CLIENTS_PER_ROUND = flags.DEFINE_list(
    "clients_per_round", "5,20", "Clients per round n, a comma-separated list (10,50,100,200 for "
    "the scaling targets).", flag_values=FLAGS)
_ALGORITHMS = flags.DEFINE_list(
    "algorithms", ",".join(BENCHMARKED_ALGORITHMS),
    "Processes to measure: " + ", ".join(BENCHMARKED_ALGORITHMS) + "; "
    "append +xla (e.g. fedavg_lora+xla) for the process with its client step XLA-compiled.",
    flag_values=FLAGS)
_LOCAL_STEPS = flags.DEFINE_integer(
    "local_steps", 5, "Batches per client per round (SGD steps per phase).", flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Rounds per configuration, >= 2 (a round: one process.next per communication "
    "round, RoLoRA's B and A); round 1 is reported apart (tracing, compilation), s/round is the "
    "mean of rounds 2..R.", flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Examples per batch.", flag_values=FLAGS)
_SEQUENCE_LENGTH = flags.DEFINE_integer("sequence_length", 32, "Tokens per example.",
    flag_values=FLAGS)
_RANK = flags.DEFINE_integer("rank", 4, "LoRA rank r (adapters on query and value).",
    flag_values=FLAGS)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Client SGD learning rate.",
    flag_values=FLAGS)
_HEAD_EPOCHS = flags.DEFINE_integer(
    "head_epochs", 1, "fedrep: head epochs per round before the representation epoch.",
    flag_values=FLAGS)
_JIT_COMPILE = flags.DEFINE_bool(
    "jit_compile", False, "Also run the plain loop with its SGD step compiled by XLA.",
    flag_values=FLAGS)
_PROFILE = flags.DEFINE_bool(
    "profile", False, "Profile one extra TFF and plain round per configuration with cProfile "
    "(<output_dir>/profiles/).", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the data and the model.", flag_values=FLAGS)
_MAX_CONCURRENT_CALLS = flags.DEFINE_integer(
    "max_concurrent_calls", None, "Clients the TFF worker trains at once; default: one per CPU "
    "core (tffl.runtime); 0 or less: unlimited (TFF's own default).", flag_values=FLAGS)
_SUITE = flags.DEFINE_enum(
    "suite", "configurations", ["configurations", "targets"],
    "configurations: the backbones x algorithms x clients-per-round given by the other flags; "
    "targets: the fixed measurements of the performance targets (benchmarks/targets.py: "
    "real SST-2 on the pretrained MiniLM, the 200-client memory scaling, the RoBERTa-large "
    "shape), which ignore the other flags but --data_dir, --targets_parts, --devices and "
    "--output_dir.", flag_values=FLAGS)
_TARGETS_PARTS = flags.DEFINE_list(
    "targets_parts", ["scaling", "main", "large"], "--suite=targets: which parts to run "
    "(main: the round times of every path, the in-process runtime's included; scaling; large; "
    "evaluation: sst2_instruct's dev evaluation on Gemma 3 270M; startup: RoLoRA's first and "
    "later rounds with and without TFF's Grappler pass (--startup_models); peer: tffl beside "
    "a Transformers + PEFT FedAvg loop on the same batches, needs --peer_python; baseline: "
    "RoLoRA's rounds on Gemma 3 270M in this checkout over --baseline_checkout's; these four "
    "not run by default).",
    flag_values=FLAGS)
_PEER_PYTHON = flags.DEFINE_string(
    "peer_python", "", "--targets_parts=peer: a Python with torch, transformers and peft (e.g. "
    "python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers peft safetensors; "
    "then /tmp/hf/bin/python). Without one the part says so and is skipped.", flag_values=FLAGS)
_PEER_MODELS = flags.DEFINE_list(
    "peer_models", list(PEER_MODELS), "--targets_parts=peer: the models compared "
    f"(benchmarks/peer.py; of {', '.join(PEER_MODELS)}).", flag_values=FLAGS)
_STARTUP_MODELS = flags.DEFINE_list(
    "startup_models", list(STARTUP_MODELS), "--targets_parts=startup: the models measured "
    f"(benchmarks/startup.py; of {', '.join(STARTUP_MODELS)}).", flag_values=FLAGS)
_BASELINE_CHECKOUT = flags.DEFINE_string(
    "baseline_checkout", "", "--targets_parts=baseline: a clone of this repository at the commit "
    "to compare with (git clone . ../base && git -C ../base checkout COMMIT); its train.py runs "
    "with this Python (benchmarks/baseline.py).", flag_values=FLAGS)
_DEVICES = flags.DEFINE_string(
    "devices", "", "--suite=targets: the devices of the in-process runtime measured against the "
    "TFF worker (scripts/train.py --devices; default: the GPUs, else the CPU).", flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", "../shared/data", "--suite=targets: the folder holding sst2/.", flag_values=FLAGS)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", "runs/benchmark", "Where benchmark.json, benchmark.md and the worker log go.",
    flag_values=FLAGS)


def _names(name: str, allowed: Sequence[str]) -> tuple[str, ...]:
    values = tuple(FLAGS[name].value)
    unknown = [v for v in values if v not in allowed]
    if not values or unknown:
        raise UsageError(f"flag --{name}={','.join(values)}: unknown "
                         f"{', '.join(unknown) or '(empty)'}; choose from {', '.join(allowed)}")
    if len(set(values)) != len(values):
        raise UsageError(f"flag --{name}={','.join(values)}: names repeat")
    return values


def config_from_flags() -> BenchmarkConfig:
    """Validates the flags together; raises `UsageError` (one line naming the flag)."""
    backbones = _names("backbones", tuple(BACKBONES))
    algorithms = _names("algorithms", (*BENCHMARKED_ALGORITHMS,
                                       *(a + XLA_SUFFIX for a in BENCHMARKED_ALGORITHMS)))
    clients = cli.int_list("clients_per_round", FLAGS["clients_per_round"].value, unique=True)
    for n in clients:
        cli.at_least("clients_per_round", n, 1)
    cli.at_least("local_steps", _LOCAL_STEPS.value, 1)
    cli.at_least("rounds", _ROUNDS.value, 2)
    cli.at_least("batch_size", _BATCH_SIZE.value, 1)
    cli.at_least("sequence_length", _SEQUENCE_LENGTH.value, 2)
    cli.at_least("rank", _RANK.value, 1)
    cli.at_least("head_epochs", _HEAD_EPOCHS.value, 1)
    longest = min(BACKBONES[b].max_sequence_length for b in backbones)
    if _SEQUENCE_LENGTH.value > longest:
        raise UsageError(f"flag --sequence_length={_SEQUENCE_LENGTH.value}: must be <= {longest} "
                         "(the backbones' position embeddings)")
    narrowest = min(BACKBONES[b].hidden_dim for b in backbones)
    if _RANK.value > narrowest:
        raise UsageError(f"flag --rank={_RANK.value}: must be <= {narrowest}, the smallest hidden "
                         "size of the chosen backbones")
    if not (math.isfinite(_LEARNING_RATE.value) and _LEARNING_RATE.value > 0):
        raise UsageError(f"flag --learning_rate={_LEARNING_RATE.value}: must be a finite number "
                         "> 0")
    return BenchmarkConfig(
        backbones=backbones, clients_per_round=tuple(sorted(clients)), algorithms=algorithms,
        local_steps=_LOCAL_STEPS.value, rounds=_ROUNDS.value, batch_size=_BATCH_SIZE.value,
        sequence_length=_SEQUENCE_LENGTH.value, rank=_RANK.value,
        learning_rate=_LEARNING_RATE.value, head_epochs=_HEAD_EPOCHS.value,
        jit_compile=_JIT_COMPILE.value, profile=_PROFILE.value,
        seed=_SEED.value, max_concurrent_calls=_MAX_CONCURRENT_CALLS.value)


def _output_dir() -> pathlib.Path:
    return cli.writable_output_dir(_OUTPUT_DIR.value)


def check(argv: list[str]) -> list[str]:
    """absl parsing into `FLAGS` (from their defaults; `runner.cli.parse_flags`) and the
    checks of `config_from_flags`; a bad value is one line on stderr and exit status 2 (no
    traceback). Imports nothing heavy."""
    name = pathlib.Path(argv[0]).name
    FLAGS.unparse_flags()
    rest = cli.parse_flags(argv, FLAGS, __doc__)
    try:
        if len(rest) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(rest[1:])} (flags are --name=value)")
        config_from_flags()
        _names("targets_parts", TARGETS_PARTS)
        _names("peer_models", PEER_MODELS)
        _names("startup_models", STARTUP_MODELS)
        if _SUITE.value == "targets" and "baseline" in _TARGETS_PARTS.value:
            try:
                baseline.checkout_root(_BASELINE_CHECKOUT.value)
            except ValueError as e:
                raise UsageError(f"flag --baseline_checkout: {e}") from None
        _output_dir()
        if _SUITE.value == "targets" and not (pathlib.Path(_DATA_DIR.value) / "sst2").is_dir():
            raise UsageError(f"flag --data_dir={_DATA_DIR.value}: no sst2/ folder there (the "
                             "targets run on real SST-2 sentences; see ../shared/data)")
    except UsageError as e:
        sys.exit(cli.error_exit(name, e, 2))
    return rest


def _parse_flags(argv: list[str]) -> list[str]:
    """`check`, then TensorFlow's import: here, not in `main`, where Keras could not build
    models (`runner.tensorflow_import`)."""
    return tensorflow_import.importing_tensorflow(check)(argv)


def main(argv: list[str]) -> int:
    del argv  # checked by _parse_flags
    config = config_from_flags()
    output_dir = _output_dir()
    from benchmarks import report, run
    from models.checkpoints import CheckpointUnavailableError
    from tffl.runtime import worker_connection

    cli.quiet_python_logs()

    def log(line: str) -> None:
        print(line, flush=True)

    command = "python scripts/benchmark.py " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    if _SUITE.value == "targets":
        from benchmarks.config import TargetsConfig
        from benchmarks.targets import run_targets

        try:
            run_targets(TargetsConfig(data_dir=_DATA_DIR.value, devices=_DEVICES.value,
                                      parts=tuple(_TARGETS_PARTS.value),
                                      peer_python=_PEER_PYTHON.value,
                                      peer_models=tuple(_PEER_MODELS.value),
                                      startup_models=tuple(_STARTUP_MODELS.value),
                                      baseline_checkout=_BASELINE_CHECKOUT.value),
                        output_dir, log=log)
        except (ValueError, OSError, FloatingPointError, worker_connection.WorkerError,
                CheckpointUnavailableError) as e:
            # CheckpointUnavailableError: MiniLM or Gemma 3 could not be fetched (offline).
            return cli.error_exit("benchmark.py", e, 1)
        print(f"{time.perf_counter() - started:.0f} s. Results in {output_dir}", flush=True)
        return 0
    try:
        result = run.run_benchmark(config, log=log, output_dir=output_dir)
    except (ValueError, OSError, FloatingPointError, worker_connection.WorkerError) as e:
        # FloatingPointError: run_rounds' NonFiniteLossError (a NaN or infinite training loss).
        return cli.error_exit("benchmark.py", e, 1)
    table = report.format_table(result)
    targets = report.format_targets(result)
    report.write_outputs(output_dir, result, table, targets, command.strip())
    print("\n" + table + "\n\n" + targets + "\n", flush=True)
    print(f"{time.perf_counter() - started:.0f} s. Results in {output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
