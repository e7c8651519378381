r"""Performance of tffl's TFF processes against a plain TensorFlow loop doing the same client work.

    python scripts/benchmark.py          # tiny BERT, 5 and 20 clients: 3-6 min on 2 CPU cores
    python scripts/benchmark.py --backbones=small --clients_per_round=10 --local_steps=20 \
        --jit_compile                    # the overhead target's setting
    python scripts/benchmark.py --clients_per_round=10,50,100,200 --algorithms=fedavg_lora
    python scripts/benchmark.py --suite=targets --output_dir=DIR   # the performance targets
                                         # (scripts/benchmark_targets.py; about 40 min)

docs/PERFORMANCE.md has the figures and what dominates the time.

Everything is measured in one process and one run, so that the ratios are fair on a noisy machine.
For each backbone × algorithm × clients-per-round n ("a configuration"):

* **TFF**: the tffl process (`tffl.lora_fl.build_lora_process` for `rolora` / `fedavg_lora`,
  `tffl.personalized.build_personalized_process("fedrep", …)` with LoRA adapters as the shared
  representation and the classifier head personal), run by `tffl.simulation.run_rounds` (the one
  round driver: `FullParticipation` over the n clients, the pre-built datasets, FedRep's heads in
  its personal-state store, one metrics row per communication round in
  <output_dir>/tff_runs/<backbone>_<algorithm>_<n>/metrics.csv, no TensorBoard, one checkpoint
  after the last round) on a fresh managed TFF C++ worker (`tffl.runtime.local_runtime`, one per
  configuration, so its peak memory is its own). A benchmark round is one round of the algorithm
  = one `process.next` per communication round (RoLoRA: a B round then an A round, two rows).
* **plain**: the same client work without TFF: one eager Keras model, one `tf.function` client
  loop (assign the broadcast weights, SGD phase by phase on the same variables with the same
  learning rate and loss, one pass over the same batches — what `tffl.client_training`'s loop
  does), called for the n clients one after the other, then the same example-weighted average of
  the uploaded deltas in numpy. It starts from the TFF process's initial weights, so after every
  round its global weights equal the TFF process's up to float32 rounding; `max_weight_diff` in
  benchmark.json checks that it is the same computation.
* **plain (XLA)**, with `--jit_compile`: the plain loop with its SGD step compiled by XLA
  (`tf.function(jit_compile=True)`).

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
* traces: Python traces of the plain client `tf.function`s (a counter in the traced body), and
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

import collections  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import dataclasses  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from scripts import cli  # noqa: E402
from scripts.cli import UsageError  # noqa: E402

# TensorFlow, TFF (through tffl.runtime) and psutil are imported by `import_tensorflow()` once the
# flags are valid, so that a bad flag fails in about a second instead of after TFF's import.
tf = None
psutil = None
runtime = None


def import_tensorflow() -> None:
    """Imports TensorFlow, psutil and `tffl.runtime` (whose exit hook stops any TFF worker on
    every exit path) into this module's globals."""
    global tf, psutil, runtime
    import psutil as psutil_module
    import tensorflow as tf_module

    from tffl import runtime as runtime_module

    tf, psutil, runtime = tf_module, psutil_module, runtime_module

ALGORITHMS = ("rolora", "fedavg_lora", "fedrep")
# "<algorithm>+xla": the same process with its client step XLA-compiled inside the client
# computation (`jit_compile=True`), to compare against the plain one in the same run.
XLA_SUFFIX = "+xla"
NUM_CLASSES = 2
# Targets of issue #10.
TARGET_OVERHEAD = 1.25
GOAL_OVERHEAD = 1.10
TARGET_MEMORY_RATIO = 1.5


@dataclasses.dataclass(frozen=True)
class BackboneShape:
    """A BERT shape (random weights): `minilm` has all-MiniLM-L6-v2's shapes."""

    name: str
    num_layers: int
    num_heads: int
    hidden_dim: int
    intermediate_dim: int
    vocabulary_size: int = 30522
    max_sequence_length: int = 512

    def describe(self) -> str:
        return (f"L={self.num_layers} H={self.hidden_dim} A={self.num_heads} "
                f"I={self.intermediate_dim} V={self.vocabulary_size}")


BACKBONES = {
    # scripts/registry.py's "tiny" random BERT.
    "tiny": BackboneShape("tiny", num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128),
    # BERT-Mini (Turc et al. 2019): the "small BERT" of the overhead target.
    "small": BackboneShape("small", num_layers=4, num_heads=4, hidden_dim=256,
                           intermediate_dim=1024),
    # all-MiniLM-L6-v2 (models/hf_bert.py), random weights.
    "minilm": BackboneShape("minilm", num_layers=6, num_heads=12, hidden_dim=384,
                            intermediate_dim=1536),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything `run_benchmark` needs (the flags, parsed). See the module docstring."""

    backbones: tuple[str, ...] = ("tiny",)
    clients_per_round: tuple[int, ...] = (5, 20)
    algorithms: tuple[str, ...] = ALGORITHMS
    local_steps: int = 5
    rounds: int = 3
    batch_size: int = 8
    sequence_length: int = 32
    rank: int = 4
    learning_rate: float = 0.05
    head_epochs: int = 1
    jit_compile: bool = False
    profile: bool = False
    seed: int = 0
    # Clients a TFF worker trains at once (None: tffl.runtime's default, one per core; <= 0:
    # unlimited, TFF's own default).
    max_concurrent_calls: int | None = None


# ------------------------------------------------------------------------------------------------
# Flags -> Config

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
    "algorithms", ",".join(ALGORITHMS), "Processes to measure: " + ", ".join(ALGORITHMS) + "; "
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
    "targets: the fixed measurements of the performance targets (scripts/benchmark_targets.py: "
    "real SST-2 on the pretrained MiniLM, the 200-client memory scaling, the RoBERTa-large "
    "shape), which ignore the other flags but --data_dir, --targets_parts, --devices and "
    "--output_dir.", flag_values=FLAGS)
_TARGETS_PARTS = flags.DEFINE_list(
    "targets_parts", ["scaling", "main", "large"], "--suite=targets: which parts to run "
    "(main: the round times of every path, the in-process runtime's included; scaling; large).",
    flag_values=FLAGS)
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


def config_from_flags() -> Config:
    """Validates the flags together; raises `UsageError` (one line naming the flag)."""
    backbones = _names("backbones", tuple(BACKBONES))
    algorithms = _names("algorithms", (*ALGORITHMS, *(a + XLA_SUFFIX for a in ALGORITHMS)))
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
    return Config(
        backbones=backbones, clients_per_round=tuple(sorted(clients)), algorithms=algorithms,
        local_steps=_LOCAL_STEPS.value, rounds=_ROUNDS.value, batch_size=_BATCH_SIZE.value,
        sequence_length=_SEQUENCE_LENGTH.value, rank=_RANK.value,
        learning_rate=_LEARNING_RATE.value, head_epochs=_HEAD_EPOCHS.value,
        jit_compile=_JIT_COMPILE.value, profile=_PROFILE.value,
        seed=_SEED.value, max_concurrent_calls=_MAX_CONCURRENT_CALLS.value)


def _output_dir() -> pathlib.Path:
    return cli.writable_output_dir(_OUTPUT_DIR.value)


# ------------------------------------------------------------------------------------------------
# Model, data, processes


class Counter:
    """A Python counter bumped by traced code (so it counts traces, not executions)."""

    def __init__(self):
        self.value = 0

    def bump(self) -> None:
        self.value += 1


def make_model_fn(shape: BackboneShape, rank: int, seed: int, calls: Counter
                  ) -> Callable[[], tf.keras.Model]:
    """`() -> classifier`: a random BERT of `shape`, LoRA (rank r) on every layer's query and
    value (base frozen), pooled output -> Dense(2) head tagged `head`. Counts its calls."""

    def keras_model_fn():
        from models import backbones
        from models import hf_bert
        from models import lora_targets

        calls.bump()
        if shape.name == "minilm":
            backbone = hf_bert.bert_backbone_from_config({
                "vocab_size": shape.vocabulary_size, "num_hidden_layers": shape.num_layers,
                "num_attention_heads": shape.num_heads, "hidden_size": shape.hidden_dim,
                "intermediate_size": shape.intermediate_dim,
                "max_position_embeddings": shape.max_sequence_length, "type_vocab_size": 2,
                "hidden_act": "gelu"})
        else:
            backbone = backbones.build_bert_backbone(
                vocabulary_size=shape.vocabulary_size, num_layers=shape.num_layers,
                num_heads=shape.num_heads, hidden_dim=shape.hidden_dim,
                intermediate_dim=shape.intermediate_dim,
                max_sequence_length=shape.max_sequence_length)
        lora_targets.apply_lora(backbone, lora_targets.LoraConfig(
            rank=rank, targets=("query", "value"), seed=seed))
        return backbones.build_classifier(backbone, NUM_CLASSES, seed=seed)

    return keras_model_fn


def input_spec(sequence_length: int):
    x = collections.OrderedDict(
        (k, tf.TensorSpec([None, sequence_length], tf.int32))
        for k in ("padding_mask", "segment_ids", "token_ids"))
    return (x, tf.TensorSpec([None], tf.int32))


def client_datasets(num_clients: int, config: Config, vocabulary_size: int
                    ) -> list[tf.data.Dataset]:
    """Synthetic token data: client i has `local_steps` batches of random token ids in
    [1, vocabulary_size), a full padding mask, segment 0 and random labels in {0, 1}."""
    out = []
    n = config.local_steps * config.batch_size
    for i in range(num_clients):
        rng = np.random.default_rng([config.seed, i])
        x = collections.OrderedDict(
            padding_mask=np.ones((n, config.sequence_length), np.int32),
            segment_ids=np.zeros((n, config.sequence_length), np.int32),
            token_ids=rng.integers(1, vocabulary_size, (n, config.sequence_length),
                                   dtype=np.int32))
        y = rng.integers(0, NUM_CLASSES, n, dtype=np.int32)
        out.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(config.batch_size))
    return out


@dataclasses.dataclass(frozen=True)
class SubRound:
    """One communication round as the plain loop runs it: local `phases` (positions in
    `model.trainable_variables`, epochs), then the deltas at `upload` are averaged."""

    name: str
    phases: tuple[tuple[tuple[int, ...], int], ...]
    upload: tuple[int, ...]


@dataclasses.dataclass
class Built:
    """A built TFF process and what the plain loop needs to do the same work."""

    algorithm: str
    backbone: BackboneShape
    process: object
    sub_rounds: tuple[SubRound, ...]
    personal: tuple[int, ...]  # fedrep: positions of the personal head
    traffic: dict  # {sub-round: RoundTraffic}
    model_fn_calls: Counter
    model_fn: Callable[[], tf.keras.Model]
    build_seconds: float

    @property
    def personalized(self) -> bool:
        return bool(self.personal)


def build_process(algorithm: str, shape: BackboneShape, config: Config) -> Built:
    """The TFF process of `algorithm` on `shape`, its per-client traffic and its sub-rounds."""
    from tffl import lora_fl
    from tffl import personalized
    from tffl import roles

    calls = Counter()
    model_fn = make_model_fn(shape, config.rank, config.seed, calls)
    spec_in = input_spec(config.sequence_length)
    started = time.perf_counter()
    name = algorithm.removesuffix(XLA_SUFFIX)
    jit_compile = name != algorithm
    if name == "fedrep":
        process = personalized.build_personalized_process(
            "fedrep", model_fn, spec_in, config.learning_rate, head_epochs=config.head_epochs,
            representation_epochs=1, jit_compile=jit_compile)
        spec = process.spec
        head = spec.indices([roles.HEAD])
        rep = spec.indices(personalized.REPRESENTATION_ROLES)
        sub_rounds = (SubRound("round", ((head, config.head_epochs), (rep, 1)), rep),)
        traffic = dict(process.traffic)
        personal = tuple(process.personal_indices)
    else:
        process = lora_fl.build_lora_process(name, model_fn, spec_in, config.learning_rate,
                                             jit_compile=jit_compile)
        spec = process.spec
        extra = (roles.HEAD,)  # the builders' default extra_roles
        if name == "rolora":
            sets = {"b_round": (roles.LORA_B, *extra), "a_round": (roles.LORA_A, *extra)}
        else:
            sets = {"ab_round": (roles.LORA_A, roles.LORA_B, *extra)}
        sub_rounds = tuple(SubRound(name, ((spec.indices(r), 1),), spec.indices(r))
                           for name, r in sets.items())
        traffic = lora_fl.traffic_per_communication_round(process)
        personal = ()
    if [s.name for s in sub_rounds] != list(traffic):
        raise RuntimeError(f"{algorithm}: sub-rounds {list(traffic)} are not the expected "
                           f"{[s.name for s in sub_rounds]}")
    return Built(algorithm, shape, process, sub_rounds, personal, traffic, calls, model_fn,
                 time.perf_counter() - started)


# ------------------------------------------------------------------------------------------------
# The plain loop


class PlainClient:
    """The client work of one sub-round without TFF: a `tf.function` `(trainable, non_trainable,
    dataset) -> (trainable values, loss_sum, num_correct, num_examples)` on `model`, which assigns
    the weights, then for each phase runs `epochs` passes of SGD on the phase's variables — the
    same steps as `tffl.client_training.build_phased_loop`. With `jit_compile` the SGD step is an
    XLA-compiled `tf.function` (the dataset loop itself cannot be compiled)."""

    def __init__(self, model: tf.keras.Model, learning_rate: float,
                 phases: Sequence[tuple[tuple[int, ...], int]], jit_compile: bool):
        self.traces = Counter()
        trainable = model.trainable_variables
        non_trainable = model.non_trainable_variables
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        traces = self.traces

        def make_step(trained, last):
            def step(x, y):
                traces.bump()
                with tf.GradientTape() as tape:
                    pred = model(x, training=True)
                    loss = loss_fn(y, pred)
                grads = tape.gradient(loss, trained,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                for variable, grad in zip(trained, grads):
                    variable.assign_sub(tf.cast(learning_rate, variable.dtype) * grad)
                if not last:
                    return loss, tf.constant(0.0)
                labels = tf.cast(tf.reshape(y, [-1]), tf.int64)
                correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(pred, -1), labels),
                                                tf.float32))
                return loss, correct

            return tf.function(step, jit_compile=True if jit_compile else None)

        steps = [make_step([trainable[i] for i in indices], p == len(phases) - 1)
                 for p, (indices, _) in enumerate(phases)]

        @tf.function
        def run(trainable_values, non_trainable_values, dataset):
            traces.bump()
            for variable, value in zip(trainable, trainable_values, strict=True):
                variable.assign(value)
            for variable, value in zip(non_trainable, non_trainable_values, strict=True):
                variable.assign(value)
            loss_sum = tf.constant(0.0)
            num_correct = tf.constant(0.0)
            num_examples = tf.constant(0.0)
            for p, (_, epochs) in enumerate(phases):
                data = dataset.repeat(epochs) if epochs > 1 else dataset
                for x, y in iter(data):  # a tf.while_loop, as in tffl's loop
                    loss, correct = steps[p](x, y)
                    if p == len(phases) - 1:
                        n = tf.cast(tf.shape(y)[0], tf.float32)
                        loss_sum += loss * n
                        num_correct += correct
                        num_examples += n
            return [v.read_value() for v in trainable], loss_sum, num_correct, num_examples

        self.run = run


class PlainRunner:
    """Runs one algorithm's rounds with the plain loop: clients one after the other, then the
    example-weighted mean of the uploaded deltas (as `tff.aggregators.MeanFactory`), in numpy."""

    def __init__(self, built: Built, model: tf.keras.Model, config: Config, jit_compile: bool):
        self.built = built
        self.clients = [PlainClient(model, config.learning_rate, s.phases, jit_compile)
                        for s in built.sub_rounds]
        self.trainable: list[np.ndarray] = []
        self.non_trainable: list[tf.Tensor] = []
        self.federated: list[int] = []
        self.personal: list[list[np.ndarray]] = []
        self.bytes = {"down": 0, "up": 0}

    def reset(self, trainable, non_trainable, num_clients: int) -> None:
        """Starts from the given whole-model weights; personal heads = the initial head. Only
        the federated variables (those some sub-round uploads) count as broadcast, as in TFF."""
        self.trainable = [np.array(w) for w in trainable]
        self.non_trainable = [tf.constant(w) for w in non_trainable]
        self.federated = sorted({k for s in self.built.sub_rounds for k in s.upload})
        self.personal = [[self.trainable[k].copy() for k in self.built.personal]
                         for _ in range(num_clients)]

    @property
    def traces(self) -> int:
        return sum(c.traces.value for c in self.clients)

    def round(self, datasets: Sequence[tf.data.Dataset]) -> None:
        """One `next`: every sub-round over all clients; records bytes per client."""
        down = up = 0
        for sub, client in zip(self.built.sub_rounds, self.clients):
            broadcast = [tf.constant(w) for w in self.trainable]
            down += sum(self.trainable[k].nbytes for k in self.federated)
            sums = {k: np.zeros_like(self.trainable[k]) for k in sub.upload}
            total = 0.0
            for i, dataset in enumerate(datasets):
                start = broadcast
                if self.built.personal:
                    start = list(broadcast)
                    for k, value in zip(self.built.personal, self.personal[i]):
                        start[k] = tf.constant(value)
                values, loss_sum, num_correct, num_examples = client.run(
                    start, self.non_trainable, dataset)
                n = float(num_examples)
                deltas = {k: values[k].numpy() - self.trainable[k] for k in sub.upload}
                metrics = [np.float32(loss_sum), np.float32(num_correct), np.float32(n)]
                if i == 0:
                    up += sum(d.nbytes for d in deltas.values()) + sum(m.nbytes for m in metrics)
                for k, d in deltas.items():
                    sums[k] += n * d
                total += n
                if self.built.personal:
                    self.personal[i] = [values[k].numpy() for k in self.built.personal]
            for k in sub.upload:
                self.trainable[k] = self.trainable[k] + (sums[k] / total).astype(
                    self.trainable[k].dtype)
        self.bytes = {"down": down, "up": up}


# ------------------------------------------------------------------------------------------------
# Measurement helpers


class PeakSampler:
    """Samples the RSS of watched processes every `interval` seconds in a thread; `take()` returns
    the peaks since the previous `take()` (per process, and of their sum at one instant)."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self._procs: dict[str, psutil.Process] = {"python": psutil.Process()}
        self._lock = threading.Lock()
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def watch(self, name: str, pid: int | None) -> None:
        with self._lock:
            if pid is None:
                self._procs.pop(name, None)
            else:
                self._procs[name] = psutil.Process(pid)

    def _sample(self) -> None:
        with self._lock:
            procs = dict(self._procs)
        now = {}
        for name, proc in procs.items():
            with contextlib.suppress(psutil.Error):
                now[name] = proc.memory_info().rss
        now["total"] = sum(now.values())
        with self._lock:
            for name, rss in now.items():
                self._peak[name] = max(self._peak.get(name, 0), rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def take(self) -> dict[str, int]:
        self._sample()
        with self._lock:
            peak, self._peak = self._peak, {}
        return peak


def _cpu_seconds(proc: psutil.Process | None) -> float:
    """User + system CPU seconds of `proc`. This process is read from `time.process_time()`
    (nanosecond clock): psutil's figures tick in 10 ms, so a short plain round could read 0."""
    if proc is None:
        return 0.0
    if proc.pid == os.getpid():
        return time.process_time()
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


class CompileCounter:
    """Counts calls of TFF's native compiler in the contexts `tffl.runtime` creates (TFF caches
    the compiled form per context and computation, so a call is a compilation)."""

    def __init__(self):
        self.calls = 0
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self):
        native = runtime.guarded.native_compiler  # the TFF module the worker contexts call
        original = native.desugar_and_transform_to_native

        def counted(comp):
            self.calls += 1
            started = time.perf_counter()
            try:
                return original(comp)
            finally:
                self.seconds += time.perf_counter() - started

        native.desugar_and_transform_to_native = counted
        try:
            yield self
        finally:
            native.desugar_and_transform_to_native = original


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _profile_text(profiler: cProfile.Profile, top: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# (module file name, function) -> label: the stages of a TFF call, from TFF 0.87's sources.
_TFF_STAGES = {
    ("compiler_pipeline.py", "compile"): "compile (cached after round 1)",
    ("tensorflow_computation.py", "transform_args"): "transform_args (datasets -> graphs)",
    ("value_serialization.py", "serialize_value"): "serialize arguments",
    ("remote_executor.py", "create_value"): "create_value (send to worker)",
    ("remote_executor.py", "create_call"): "create_call",
    ("remote_executor.py", "_compute"): "compute (run on worker, fetch result)",
    ("value_serialization.py", "deserialize_value"): "deserialize results",
    ("tensorflow_computation.py", "transform_result"): "transform_result",
}


def _profile_summary(profiler: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds of the stages of TFF calls (`_TFF_STAGES`) and the total."""
    stats = pstats.Stats(profiler)
    out: dict[str, float] = {}
    for (filename, _, func), (_, _, _, cumtime, _) in stats.stats.items():
        label = _TFF_STAGES.get((pathlib.Path(filename).name, func))
        if label is not None:
            out[label] = max(out.get(label, 0.0), cumtime)
    out["total"] = max((v[3] for v in stats.stats.values()), default=0.0)
    return {k: round(v, 4) for k, v in out.items()}


def profile_tff_call(context, fn: Callable[[], object]) -> cProfile.Profile:
    """cProfile of `fn()` where TFF does its work: `SyncExecutionContext.invoke` runs the call as
    a coroutine on its own event-loop thread (serialization, gRPC to the worker), so the profiler
    is switched on and off in that thread (falls back to this thread)."""
    import asyncio

    profiler = cProfile.Profile()
    loop = getattr(getattr(context, "_async_runner", None), "_event_loop", None)
    if loop is None:
        profiler.runcall(fn)
        return profiler

    async def switch(on: bool):
        profiler.enable() if on else profiler.disable()

    asyncio.run_coroutine_threadsafe(switch(True), loop).result()
    try:
        fn()
    finally:
        asyncio.run_coroutine_threadsafe(switch(False), loop).result()
    return profiler


# ------------------------------------------------------------------------------------------------
# The benchmark


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return float(max((np.max(np.abs(np.asarray(x) - np.asarray(y))) if np.size(x) else 0.0)
                     for x, y in zip(a, b, strict=True)))


def state_round_trip_seconds(weights_type, weights, repeats: int = 2) -> float:
    """Seconds to send the model weights from Python to the TFF worker and back: an identity TF
    computation on them (its first call, which compiles, is not timed). Every `next` pays this
    once (the state goes in, the new state comes out), whatever the clients do."""
    import tensorflow_federated as tff

    @tff.tensorflow.computation(weights_type)
    def identity(w):
        return tf.nest.map_structure(tf.identity, w)

    identity(weights)
    started = time.perf_counter()
    for _ in range(repeats):
        identity(weights)
    return (time.perf_counter() - started) / repeats


def run_configuration(built: Built, num_clients: int, datasets: Sequence[tf.data.Dataset],
                      model: tf.keras.Model, config: Config, sampler: PeakSampler,
                      log: Callable[[str], None], output_dir: pathlib.Path | None = None
                      ) -> dict:
    """TFF and plain rounds, alternating, on a fresh TFF worker; returns the configuration's row.

    The TFF rounds run through `tffl.simulation.run_rounds` (the one round driver): all
    `num_clients` clients every round (`FullParticipation` over ids "0".."n-1", client i's data
    `datasets[i]`), `rounds × len(built.sub_rounds)` communication rounds, one metrics row each.
    Its `after_round` callback closes a benchmark round after the last of its communication
    rounds: it takes the TFF measurements, then runs the plain rounds, so the two still
    alternate within one process. See the module docstring for what each TFF figure spans.

    The plain loops run on `model` (an eager model of the backbone) with `tf.function`s made for
    this configuration, so both paths trace (and XLA compiles) in their round 1."""
    from tffl import participation
    from tffl import simulation

    process = built.process
    plain = {"plain": PlainRunner(built, model, config, jit_compile=False)}
    if config.jit_compile:
        plain["plain_xla"] = PlainRunner(built, model, config, jit_compile=True)
    profile_dir = output_dir / "profiles" if config.profile and output_dir is not None else None
    stem = f"{built.backbone.name}_{built.algorithm.replace('+', '_')}_{num_clients}"
    datasets = list(datasets[:num_clients])
    client_ids = [str(i) for i in range(num_clients)]
    by_id = dict(zip(client_ids, datasets, strict=True))
    per_round = len(built.sub_rounds)  # communication rounds (metrics rows) per benchmark round
    total = config.rounds * per_round
    compiles = CompileCounter()
    tff_times, tff_driver_times, tff_cpu_py, tff_cpu_worker = [], [], [], []
    model_fn_calls, compile_calls = [], []
    plain_times = {name: [] for name in plain}
    plain_cpu = {name: [] for name in plain}
    plain_traces = {name: [] for name in plain}
    tff_peak: dict[str, int] = {}
    plain_peak = {name: {} for name in plain}
    profiles = {}

    def merge(peaks: dict[str, int], new: dict[str, int]) -> None:
        for k, v in new.items():
            peaks[k] = max(peaks.get(k, 0), v)

    me = psutil.Process()
    setup_started = time.perf_counter()
    with compiles.installed(), runtime.local_runtime(
            log_dir=output_dir, max_concurrent_calls=config.max_concurrent_calls) as context, \
            cli.run_directory(None if output_dir is None else output_dir / "tff_runs" / stem,
                              prefix=f"benchmark_{stem}_") as run_dir:
        pids = runtime.running_workers()
        worker = psutil.Process(pids[0]) if pids else None
        sampler.watch("worker", pids[0] if pids else None)
        sampler.take()
        # The initial state: the plain runners' start, and run_rounds' (`initial_state`).
        state = process.initialize()
        weights = process.model_weights(state)  # the whole model: frozen weights included
        for runner in plain.values():
            runner.reset(weights.trainable, weights.non_trainable, num_clients)
        merge(tff_peak, sampler.take())
        setup_seconds = time.perf_counter() - setup_started

        # The TFF side of benchmark round r spans its `per_round` communication rounds in
        # run_rounds: from its first client-dataset request (just before the first `next`) to
        # the `after_round` callback of its last. Wall time ("TFF s/round") is the sum of the
        # rows' `round_seconds`: the `next` calls alone (for FedRep with run_rounds' personal-
        # store look-up and write-back around them). CPU, peak memory and the counters are
        # deltas over the whole span, so they also include run_rounds' bookkeeping: handing the
        # state and data in and the output apart, flattening the metrics into a row and
        # rewriting metrics.csv (no TensorBoard), and, in the last round only, the one checkpoint
        # (checkpoint_every = all rounds). `tff_driver_round_seconds` is the span's wall time.
        mark: dict[str, float] = {}
        rows: list[dict] = []  # the current benchmark round's metrics rows

        def start_benchmark_round(round_num: int) -> None:
            # Peak memory since the previous take: in round 1, run_rounds' own start, TFF's work;
            # later, only the idle gap after the plain rounds.
            peak = sampler.take()
            if round_num == 1:
                merge(tff_peak, peak)
            mark.update(calls=built.model_fn_calls.value, compiles=compiles.calls,
                        cpu=_cpu_seconds(me), worker_cpu=_cpu_seconds(worker),
                        started=time.perf_counter())

        def client_dataset(client_id: str, round_num: int) -> tf.data.Dataset:
            # run_rounds asks for the round's datasets right before `next`: the first request of
            # a benchmark round's first communication round starts its TFF measurement.
            if (round_num - 1) % per_round == 0 and client_id == client_ids[0]:
                start_benchmark_round(round_num)
            return by_id[client_id]

        def check_traffic(rows: list[dict]) -> None:
            """The rows' bytes per client (what run_rounds reports) are the sub-rounds' figures
            this benchmark reports (`built.traffic`), in order."""
            for row, (name, expected) in zip(rows, built.traffic.items()):
                got = (row.get("bytes_down_per_client"), row.get("bytes_up_per_client"))
                if got != (None, None) and got != (expected.down, expected.up):
                    raise RuntimeError(f"{built.algorithm}: run_rounds reported {got} bytes per "
                                       f"client for {name}, the process's traffic says "
                                       f"{(expected.down, expected.up)}")

        def after_round(row, state) -> None:
            del state  # the final state is run_rounds' result
            rows.append(dict(row))
            if len(rows) < per_round:
                return
            tff_driver_times.append(time.perf_counter() - mark["started"])
            tff_times.append(sum(r["round_seconds"] for r in rows))
            merge(tff_peak, sampler.take())
            tff_cpu_py.append(_cpu_seconds(me) - mark["cpu"])
            tff_cpu_worker.append(_cpu_seconds(worker) - mark["worker_cpu"])
            model_fn_calls.append(built.model_fn_calls.value - mark["calls"])
            compile_calls.append(compiles.calls - mark["compiles"])
            check_traffic(rows)
            rows.clear()
            for name, runner in plain.items():
                sampler.take()
                cpu0 = _cpu_seconds(me)
                started = time.perf_counter()
                runner.round(datasets)
                plain_times[name].append(time.perf_counter() - started)
                plain_cpu[name].append(_cpu_seconds(me) - cpu0)
                merge(plain_peak[name], sampler.take())
                plain_traces[name].append(runner.traces)
            log(f"  round {len(tff_times)}: TFF {tff_times[-1]:.2f} s, " + ", ".join(
                f"{name} {plain_times[name][-1]:.2f} s" for name in plain))

        result = simulation.run_rounds(
            process, participation.FullParticipation(client_ids), client_dataset, rounds=total,
            output_dir=run_dir, checkpoint_every=total,
            config=dataclasses.asdict(config) | dict(backbone=built.backbone.name,
                                                     algorithm=built.algorithm,
                                                     clients_per_round=num_clients),
            log=None, tensorboard=False, after_round=after_round, initial_state=state)
        if len(result.history) != total or len(tff_times) != config.rounds:
            raise RuntimeError(f"{stem}: run_rounds ran {len(result.history)} communication "
                               f"rounds ({len(tff_times)} benchmark rounds), expected {total}")
        state = result.state
        personal = (result.personal_store.lookup(client_ids) if built.personalized else None)

        # State I/O: the federated weights (the server state's model), Python -> worker -> Python.
        state_io = state_round_trip_seconds(process.get_model_weights.type_signature.result,
                                            process.get_model_weights(state))
        tff_weights = process.model_weights(state)
        diffs = {name: _max_diff(tff_weights.trainable, runner.trainable)
                 for name, runner in plain.items()}
        if built.personalized:
            for name, runner in plain.items():
                diffs[name] = max(diffs[name], max(
                    _max_diff(p, q) for p, q in zip(personal, runner.personal)))
        if profile_dir is not None:
            # One extra, profiled round calls the process directly, not through run_rounds: it
            # is not one of the benchmark's rounds (nor timed), only cProfile's view of a round.
            def tff_round():
                nonlocal state, personal
                for _ in built.sub_rounds:  # one `next` per communication round (RoLoRA: B, A)
                    if built.personalized:
                        out = process.next(state, datasets, personal)
                        state, personal = out.state, out.personal_states
                    else:
                        state = process.next(state, datasets).state

            profile_dir.mkdir(parents=True, exist_ok=True)
            profiler = profile_tff_call(context, tff_round)
            (profile_dir / f"{stem}_tff.txt").write_text(_profile_text(profiler))
            profiles["tff"] = _profile_summary(profiler)
            profiler = cProfile.Profile()
            profiler.runcall(plain["plain"].round, datasets)
            (profile_dir / f"{stem}_plain.txt").write_text(_profile_text(profiler))
            profiles["plain"] = {"total": round(max(
                (v[3] for v in pstats.Stats(profiler).stats.values()), default=0.0), 4)}
        if worker is not None:
            # The worker's lifetime peak (it serves only this configuration): exact on Linux.
            with contextlib.suppress(OSError, ValueError):
                for line in pathlib.Path(f"/proc/{worker.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        tff_peak["worker_hwm"] = int(line.split()[1]) * 1024
        sampler.watch("worker", None)

    traffic = built.traffic
    down = sum(t.down for t in traffic.values())
    up = sum(t.up for t in traffic.values())
    tff_s = _mean(tff_times[1:])
    row = {
        "backbone": built.backbone.name,
        "algorithm": built.algorithm,
        "clients_per_round": num_clients,
        "local_steps": config.local_steps,
        "sgd_steps_per_client": config.local_steps * sum(
            e for s in built.sub_rounds for _, e in s.phases),
        "build_seconds": round(built.build_seconds, 3),
        "tff_setup_seconds": round(setup_seconds, 3),
        "tff_round_seconds": [round(t, 6) for t in tff_times],
        "tff_driver_round_seconds": [round(t, 6) for t in tff_driver_times],
        "tff_seconds_per_round": tff_s,
        "tff_round1_seconds": tff_times[0],
        "tff_python_cpu_seconds": [round(t, 3) for t in tff_cpu_py],
        "tff_worker_cpu_seconds": [round(t, 3) for t in tff_cpu_worker],
        "tff_model_fn_calls_per_round": model_fn_calls,
        "tff_compilations_per_round": compile_calls,
        "tff_retraces_after_round2": sum(model_fn_calls[2:]) + sum(compile_calls[2:]),
        "tff_peak_rss_bytes": tff_peak,
        "tff_state_round_trip_seconds": state_io,
        "bytes_down_per_client": down,
        "bytes_up_per_client": up,
        "traffic_per_communication_round": {
            k: {"down": t.down, "up": t.up} for k, t in traffic.items()},
        "max_weight_diff": diffs,
        "profile": profiles,
    }
    for name, runner in plain.items():
        times = plain_times[name]
        traces = plain_traces[name]
        row[f"{name}_round_seconds"] = [round(t, 6) for t in times]
        row[f"{name}_seconds_per_round"] = _mean(times[1:])
        row[f"{name}_round1_seconds"] = times[0]
        row[f"{name}_cpu_seconds"] = [round(t, 3) for t in plain_cpu[name]]
        row[f"{name}_traces_per_round"] = [traces[0]] + [b - a for a, b in zip(traces, traces[1:])]
        row[f"{name}_retraces_after_round2"] = traces[-1] - traces[min(1, len(traces) - 1)]
        row[f"{name}_peak_rss_bytes"] = plain_peak[name]
        row[f"{name}_bytes"] = dict(runner.bytes)
    row["overhead_ratio"] = tff_s / row["plain_seconds_per_round"]
    # CPU seconds (this process + the worker) per round, rounds 2..R: TFF's cost without the
    # effect of the worker running clients in parallel.
    row["cpu_overhead_ratio"] = (_mean(tff_cpu_py[1:]) + _mean(tff_cpu_worker[1:])) / _mean(
        plain_cpu["plain"][1:])
    if "plain_xla" in plain:
        row["xla_speedup"] = row["plain_seconds_per_round"] / row["plain_xla_seconds_per_round"]
    return row


def run_benchmark(config: Config, log: Callable[[str], None] = print,
                  shapes: dict[str, BackboneShape] | None = None,
                  output_dir: pathlib.Path | None = None) -> dict:
    """Builds every process first (TFF traces Keras models in graphs, which invalidates eager
    Keras 2 models made before), then the eager plain models, then runs every configuration.
    Must NOT run inside a `runtime.local_runtime()`: each configuration starts its own worker."""
    import_tensorflow()
    shapes = shapes or BACKBONES
    return _run_benchmark(config, log, shapes, output_dir)


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _run_benchmark(config, log, shapes, output_dir) -> dict:
    load_at_start = _load()
    tf.keras.utils.set_random_seed(config.seed)
    built: dict[tuple[str, str], Built] = {}
    for b in config.backbones:
        for algorithm in config.algorithms:
            log(f"building {algorithm} on {b} ({shapes[b].describe()}) ...")
            built[b, algorithm] = build_process(algorithm, shapes[b], config)
            log(f"  built in {built[b, algorithm].build_seconds:.1f} s")
    pool = client_datasets(max(config.clients_per_round), config,
                           min(shapes[b].vocabulary_size for b in config.backbones))
    rows = []
    with PeakSampler() as sampler:
        for b in config.backbones:
            # One eager model per backbone, shared by the plain loops of all algorithms.
            model = built[b, config.algorithms[0]].model_fn()
            for algorithm in config.algorithms:
                for n in config.clients_per_round:
                    log(f"{b} {algorithm} n={n}:")
                    rows.append(run_configuration(built[b, algorithm], n, pool, model, config,
                                                  sampler, log, output_dir))
    return {
        "config": dataclasses.asdict(config),
        "backbones": {b: dataclasses.asdict(shapes[b]) for b in config.backbones},
        "rows": rows,
        "targets": evaluate_targets(rows, config),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "tensorflow": tf.__version__,
                    "load_average_at_start": load_at_start, "load_average_at_end": _load()},
    }


def _mb(n: int | float | None) -> float:
    return float("nan") if n is None else n / 2**20


def evaluate_targets(rows: list[dict], config: Config) -> dict:
    """Status against issue #10's targets, from the rows that bear on each."""
    out: dict = {}
    overhead = [r for r in rows if r["backbone"] == "small" and r["clients_per_round"] == 10
                and r["local_steps"] == 20]
    out["overhead"] = {
        "target": TARGET_OVERHEAD, "goal": GOAL_OVERHEAD,
        "measured": {r["algorithm"]: round(r["overhead_ratio"], 3) for r in overhead},
        "status": ("not measured (needs --backbones=small --clients_per_round=10 "
                   "--local_steps=20)" if not overhead else
                   "met" if all(r["overhead_ratio"] <= TARGET_OVERHEAD for r in overhead)
                   else "not met"),
    }
    scaling, memory = {}, {}
    for (b, a) in sorted({(r["backbone"], r["algorithm"]) for r in rows}):
        group = sorted((r for r in rows if (r["backbone"], r["algorithm"]) == (b, a)),
                       key=lambda r: r["clients_per_round"])
        if len(group) < 2:
            continue
        lo, hi = group[0], group[-1]
        growth = hi["clients_per_round"] / lo["clients_per_round"]
        time_ratio = hi["tff_seconds_per_round"] / lo["tff_seconds_per_round"]
        scaling[f"{b}/{a}"] = {
            "clients": [lo["clients_per_round"], hi["clients_per_round"]],
            "time_ratio": round(time_ratio, 3), "clients_ratio": growth,
            # "at most linear": per-client time does not grow (10% allowance for noise).
            "at_most_linear": time_ratio <= 1.1 * growth,
        }
        mem = {}
        for key in ("total", "worker"):
            a_lo, a_hi = lo["tff_peak_rss_bytes"].get(key), hi["tff_peak_rss_bytes"].get(key)
            if a_lo and a_hi:
                mem[key] = round(a_hi / a_lo, 3)
        memory[f"{b}/{a}"] = {"clients": [lo["clients_per_round"], hi["clients_per_round"]],
                              "peak_ratio": mem,
                              "within_target": mem.get("total", float("inf"))
                              <= TARGET_MEMORY_RATIO}
    out["linear_scaling"] = scaling
    out["memory"] = memory
    out["memory_target"] = ("not measured (needs --clients_per_round=10,...,200)"
                            if not any(set(v["clients"]) == {10, 200} for v in memory.values())
                            else "met" if all(v["within_target"] for v in memory.values()
                                              if set(v["clients"]) == {10, 200}) else "not met")
    retraces = {f"{r['backbone']}/{r['algorithm']}/{r['clients_per_round']}": {
        "tff": r["tff_retraces_after_round2"],
        **{k[:-len("_retraces_after_round2")]: v for k, v in r.items()
           if k.endswith("_retraces_after_round2") and not k.startswith("tff")}}
        for r in rows}
    out["no_retracing_after_round2"] = {
        "status": ("not measured (needs --rounds >= 3)" if config.rounds < 3 else
                   "met" if all(v == 0 for d in retraces.values() for v in d.values())
                   else "not met"),
        "retraces": retraces}
    return out


def format_table(result: dict) -> str:
    rows = result["rows"]
    xla = any("plain_xla_seconds_per_round" in r for r in rows)
    head = ["backbone", "algorithm", "n", "TFF s/rnd", "plain s/rnd", "overhead", "CPU ratio",
            "state I/O s", "TFF r1 s", "plain r1 s"]
    if xla:
        head += ["XLA s/rnd", "XLA gain"]
    head += ["down B/cl", "up B/cl", "TFF peak MB", "(worker)", "plain MB", "retraces"]
    lines = []
    for r in rows:
        cells = [r["backbone"], r["algorithm"], str(r["clients_per_round"]),
                 f"{r['tff_seconds_per_round']:.2f}", f"{r['plain_seconds_per_round']:.2f}",
                 f"{r['overhead_ratio']:.2f}", f"{r['cpu_overhead_ratio']:.2f}",
                 f"{r['tff_state_round_trip_seconds']:.2f}", f"{r['tff_round1_seconds']:.2f}",
                 f"{r['plain_round1_seconds']:.2f}"]
        if xla:
            cells += [f"{r['plain_xla_seconds_per_round']:.2f}", f"{r['xla_speedup']:.2f}"]
        peak = r["tff_peak_rss_bytes"]
        retr = f"{r['tff_retraces_after_round2']}/{r['plain_retraces_after_round2']}"
        if xla:
            retr += f"/{r['plain_xla_retraces_after_round2']}"
        cells += [f"{r['bytes_down_per_client']:,}", f"{r['bytes_up_per_client']:,}",
                  f"{_mb(peak.get('total')):.0f}",
                  f"{_mb(max(peak.get('worker', 0), peak.get('worker_hwm', 0))):.0f}",
                  f"{_mb(r['plain_peak_rss_bytes'].get('python')):.0f}", retr]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]

    def fmt(cells):
        return "| " + " | ".join(c.rjust(w) if i > 1 else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    out = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(c) for c in lines]
    return "\n".join(out)


def format_targets(result: dict) -> str:
    t = result["targets"]
    lines = []
    o = t["overhead"]
    lines.append(f"TFF overhead ratio <= {o['target']} (small BERT, 10 clients x 20 steps): "
                 f"{o['status']}" + (f" {o['measured']}" if o["measured"] else ""))
    if o["measured"]:
        lines.append(f"  goal <= {o['goal']}: "
                     + ("met" if all(v <= o["goal"] for v in o["measured"].values())
                        else "not met"))
    for key, s in t["linear_scaling"].items():
        lines.append(f"scaling {key}: n {s['clients'][0]}->{s['clients'][1]} (x"
                     f"{s['clients_ratio']:g}), TFF time x{s['time_ratio']:.2f} "
                     f"({'at most linear' if s['at_most_linear'] else 'SUPERLINEAR'}); peak RSS "
                     + ", ".join(f"{k} x{v:.2f}" for k, v in
                                 t["memory"][key]["peak_ratio"].items()))
    lines.append(f"peak memory at 200 clients <= {TARGET_MEMORY_RATIO} x at 10: "
                 f"{t['memory_target']}")
    lines.append(f"no retracing after round 2: {t['no_retracing_after_round2']['status']}")
    return "\n".join(lines)


def write_outputs(output_dir: pathlib.Path, result: dict, table: str, targets: str,
                  command: str) -> None:
    result = dict(result, command=command)
    (output_dir / "benchmark.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (output_dir / "benchmark.md").write_text(
        f"# tffl benchmark\n\n`{command}`\n\n{table}\n\n```\n{targets}\n```\n")


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing (`scripts.cli.parse_flags`) and the checks of `config_from_flags`; a bad value
    is one line on stderr and exit status 2 (no traceback), before TensorFlow is imported.
    TensorFlow is imported here, not in `main`: imported inside `main`, Keras 2 builds layers on
    graph tensors instead of KerasTensors (see scripts/train.py)."""
    name = pathlib.Path(argv[0]).name
    rest = cli.parse_flags(argv, FLAGS, __doc__)
    try:
        if len(rest) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(rest[1:])} (flags are --name=value)")
        config_from_flags()
        _output_dir()
        if _SUITE.value == "targets" and not (pathlib.Path(_DATA_DIR.value) / "sst2").is_dir():
            raise UsageError(f"flag --data_dir={_DATA_DIR.value}: no sst2/ folder there (the "
                             "targets run on real SST-2 sentences; see ../shared/data)")
    except UsageError as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"{name}: error: {e}\n")
        sys.exit(2)
    import_tensorflow()
    return rest


def main(argv: list[str]) -> int:
    del argv  # checked by _parse_flags
    config = config_from_flags()
    output_dir = _output_dir()
    import_tensorflow()
    if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
        cli.quiet_python_logs()

    def log(line: str) -> None:
        print(line, flush=True)

    command = "python scripts/benchmark.py " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    if _SUITE.value == "targets":
        from scripts import benchmark_targets

        benchmark_targets.run_targets(
            benchmark_targets.TargetsConfig(data_dir=_DATA_DIR.value, devices=_DEVICES.value,
                                            parts=tuple(_TARGETS_PARTS.value)),
            output_dir, log=log)
        print(f"{time.perf_counter() - started:.0f} s. Results in {output_dir}", flush=True)
        return 0
    try:
        result = run_benchmark(config, log=log, output_dir=output_dir)
    except (ValueError, OSError, FloatingPointError, runtime.WorkerError) as e:
        # FloatingPointError: run_rounds' NonFiniteLossError (a NaN or infinite training loss).
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"benchmark.py: error: {e}\n")
        return 1
    table = format_table(result)
    targets = format_targets(result)
    write_outputs(output_dir, result, table, targets, command.strip())
    print("\n" + table + "\n\n" + targets + "\n", flush=True)
    print(f"{time.perf_counter() - started:.0f} s. Results in {output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
