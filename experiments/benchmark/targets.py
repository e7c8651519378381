"""`scripts/benchmark.py --suite=targets`: the measurements behind issue #16's targets, one run.

    uv run python scripts/benchmark.py --suite=targets --output_dir=DIR   # about 40 min, 2 cores

Every ratio compares paths run alternately in this one process (round t of every path, then
round t+1), so a slow phase of the machine hits them all. Round 1 (tracing, TFF's compilation)
is left out of every mean.

**Main setting**: real SST-2 sentences (`../shared/data/sst2`, IID over 10 clients), the
pretrained all-MiniLM-L6-v2, LoRA r = 4 on query and value of layers 3-5 plus the head,
10 clients × 20 steps of batch 16, at most 32 tokens; RoLoRA and FedAvg-LoRA. Four paths do the
same rounds from the same start:

* `previous`: the TFF process on the whole model with batches padded to 32 tokens in drawn order
  (`--noprefix_cache --nobucket_by_length`, the path before this change);
* `tff`: the TFF process on the suffix (layers 3-5, pooler, head) fed the cached h_3, batches
  bucketed by length (the default path);
* `plain_uncached`: a plain `tf.function` loop (one eager Keras model, frozen weights assigned
  once, the trained variables assigned per client, SGD over a `tf.data` iterator in a
  `tf.while_loop`, the example-weighted mean in numpy) doing `previous`'s work;
* `plain_cached`: the same loop on the suffix with `tff`'s batches.

A round is one communication round (one `next`; RoLoRA alternates B and A rounds). Seconds are
wall time of `next` (TFF) or of the loop over the clients (plain); CPU seconds are this process's
plus the TFF worker's over the same span. h_3 is computed once per example when a round first
needs it, before the round's timer starts; that time is reported apart
(`prefix_seconds_per_example`) and `round_time_vs_previous_path_first_epoch` charges it to the
rounds that computed it (every example new, as in a first pass over the data).

**State I/O**: an identity TFF computation on the `tff` path's federated weights.
**Scaling**: peak RSS (this process + a fresh worker) during 2 FedAvg-LoRA rounds of n clients ×
2 steps at MiniLM shapes (the default path), n = 10 and 200. **Large**: a RoBERTa-large-shaped
backbone (random weights) runs 2 RoLoRA rounds of 2 clients × 2 steps, LoRA on query and value of
layers 18-23 (RoLoRA's P2 budget for SST-2), through the default path and the uncached one.

**In-process runtime** (`distribute` path): the `tff` path's process and data run by
`tffl.runtime.DistributeContext` (the same computations in this process under a tf.distribute
strategy, `TargetsConfig.devices`) instead of the TFF worker; `distribute_vs_tff_round_time` is
its mean round time over the worker's.

Top-level keys of benchmark.json: `round_time_vs_previous_path`, `round_time_vs_plain_uncached`,
`cpu_vs_plain_cached`, `state_io_seconds`, `distribute_vs_tff_round_time` (each the worse of the
two algorithms), `memory_200_vs_10`, `large_seconds_per_step`, `large_peak_mb`; details under
`main`, `scaling`, `large`. `TargetsConfig.parts` (`--targets_parts`) runs a subset; the keys of
the parts not run are absent.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Sequence

import numpy as np

TARGETS = {"round_time_vs_previous_path": 1 / 3, "round_time_vs_plain_uncached": 0.5,
           "cpu_vs_plain_cached": 1.05, "state_io_seconds": 0.05, "memory_200_vs_10": 1.5}
LARGE_MEMORY_LIMIT_MB = 24 * 1024


@dataclasses.dataclass(frozen=True)
class TargetsConfig:
    data_dir: str = "../shared/data"
    num_clients: int = 10
    local_steps: int = 20
    batch_size: int = 16
    sequence_length: int = 32
    rank: int = 4
    lora_layers: tuple[int, ...] = (3, 4, 5)
    learning_rate: float = 0.05
    rounds: int = 3  # communication rounds per path and algorithm; round 1 is not averaged
    algorithms: tuple[str, ...] = ("rolora", "fedavg_lora")
    scaling_clients: tuple[int, int] = (10, 200)
    large_layers: tuple[int, ...] = tuple(range(18, 24))
    seed: int = 0
    devices: str = ""  # the in-process runtime's devices (default: the GPUs, else the CPU)
    parts: tuple[str, ...] = ("scaling", "main", "large")


# ------------------------------------------------------------------------------------------------
# The plain loop


class PlainLoop:
    """Communication rounds without TFF on one eager model: set the global weights, then per
    client assign the broadcast trained variables, run SGD on them over the client's batches in a `tf.function`, read them
    back; then the example-weighted mean of the uploaded deltas in numpy (as `MeanFactory`)."""

    def __init__(self, model, trainable: Sequence[np.ndarray], non_trainable, learning_rate: float,
                 sets: dict[str, tuple[int, ...]]):
        import tensorflow as tf

        self.model = model
        for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
            variable.assign(value)  # once: frozen weights never change
        self.weights = [np.array(w) for w in trainable]
        self.sets = sets
        variables = model.trainable_variables
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self._runs = {}
        for kind, indices in sets.items():
            trained = [variables[k] for k in indices]

            def run(values, dataset, trained=trained):
                for variable, value in zip(trained, values):
                    variable.assign(value)
                loss_sum, count = tf.constant(0.0), tf.constant(0.0)
                for x, y in iter(dataset):
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, model(x, training=True))
                    grads = tape.gradient(loss, trained,
                                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    for variable, grad in zip(trained, grads):
                        variable.assign_sub(learning_rate * grad)
                    n = tf.cast(tf.shape(y)[0], tf.float32)
                    loss_sum += loss * n
                    count += n
                return [v.read_value() for v in trained], loss_sum, count

            self._runs[kind] = tf.function(run)

    def round(self, kind: str, datasets) -> float:
        """One communication round of `kind`; returns the mean train loss."""
        indices = self.sets[kind]
        for variable, value in zip(self.model.trainable_variables, self.weights):
            variable.assign(value)  # the variables this round does not train: the global ones
        start = [self.weights[k] for k in indices]
        sums = [np.zeros_like(w) for w in start]
        total = loss_total = 0.0
        for dataset in datasets:
            values, loss_sum, count = self._runs[kind](start, dataset)
            n = float(count)
            for s, v, w in zip(sums, values, start):
                s += n * (v.numpy() - w)
            total += n
            loss_total += float(loss_sum)
        for k, s in zip(indices, sums):
            self.weights[k] = self.weights[k] + (s / total).astype(self.weights[k].dtype)
        return loss_total / total


def trained_sets(process, algorithm: str) -> dict[str, tuple[int, ...]]:
    """Positions in `spec.trainable` each round kind trains and uploads (the builders' default
    extra role, the head, rides along)."""
    from tffl.engine import roles

    spec = process.spec
    if algorithm == "rolora":
        return {"b_round": tuple(spec.indices([roles.LORA_B, roles.HEAD])),
                "a_round": tuple(spec.indices([roles.LORA_A, roles.HEAD]))}
    return {"ab_round": tuple(spec.indices([roles.LORA_A, roles.LORA_B, roles.HEAD]))}


# ------------------------------------------------------------------------------------------------
# Measurement


class Meter:
    """Wall and CPU seconds (this process + the TFF worker) and peak RSS over a span."""

    def __init__(self, sampler, worker):
        import psutil

        self.sampler, self.worker, self.me = sampler, worker, psutil.Process()

    def cpu(self) -> float:
        from experiments.benchmark import measure

        return measure.cpu_seconds(self.me) + measure.cpu_seconds(self.worker)

    def measure(self, fn: Callable[[], object]) -> tuple[object, dict]:
        self.sampler.take()
        cpu, started = self.cpu(), time.perf_counter()
        out = fn()
        seconds, cpu_seconds = time.perf_counter() - started, self.cpu() - cpu
        peaks = self.sampler.take()
        return out, {"seconds": seconds, "cpu_seconds": cpu_seconds,
                     "peak_mb": peaks.get("total", 0) / 2**20,
                     "peak_mb_by_process": {k: v / 2**20 for k, v in peaks.items()
                                            if k != "total"}}


def _leaf(metrics, name: str) -> float:
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            if key == name and not isinstance(value, dict):
                return float(value)
            found = _leaf(value, name)
            if found == found:
                return found
    return float("nan")


def _mean_after_first(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows[1:]]
    return float(np.mean(values)) if values else float("nan")


def run_main(config: TargetsConfig, log) -> dict:
    """The main setting: four paths × the algorithms, rounds alternating."""
    import tensorflow as tf

    from experiments.benchmark import measure
    from tasks import registry
    from experiments import algorithms
    from tffl import runtime

    tasks = {}
    for name, cached in (("previous", False), ("tff", True)):
        started = time.perf_counter()
        tasks[name] = registry.build_task(
            "sst2", num_clients=config.num_clients, batch_size=config.batch_size,
            local_steps=config.local_steps, seed=config.seed, data_dir=config.data_dir,
            backbone="minilm", rank=config.rank, lora_layers=config.lora_layers,
            sequence_length=config.sequence_length, prefix_cache=cached,
            bucket_by_length=cached)
        log(f"[{name}] {tasks[name].description} ({time.perf_counter() - started:.0f} s)")
    cache = tasks["tff"].prefix_cache
    ids = tasks["tff"].client_ids[:config.num_clients]
    out = {"setting": dataclasses.asdict(config), "algorithms": {}}
    prefix_all = []  # h_3 computations of every round: the cache is shared by the algorithms
    # The in-process runtime runs the "tff" path's process on the same data (issue 17); one
    # context for all rounds, so that its compiled computations are reused as the worker's are.
    in_process = runtime.DistributeContext(runtime.build_strategy(config.devices))
    with measure.PeakSampler() as sampler, runtime.local_runtime():
        pids = runtime.running_workers()
        worker = __import__("psutil").Process(pids[0]) if pids else None
        sampler.watch("worker", pids[0] if pids else None)
        meter = Meter(sampler, worker)
        for algorithm in config.algorithms:
            processes = {p: algorithms.build_algorithm(algorithm, tasks[p], config.learning_rate)
                         for p in tasks}
            states = {p: processes[p].initialize() for p in tasks}
            plain = {}
            for p, plain_name in (("previous", "plain_uncached"), ("tff", "plain_cached")):
                weights = processes[p].model_weights(states[p])
                plain[plain_name] = PlainLoop(tasks[p].keras_model_fn(), weights.trainable,
                                              weights.non_trainable, config.learning_rate,
                                              trained_sets(processes[p], algorithm))
            rows = {p: [] for p in ("previous", "tff", "distribute", "plain_uncached",
                                    "plain_cached")}
            distributed_state = states["tff"]
            prefix_rows = []
            for t in range(config.rounds):
                data = {p: None for p in tasks}
                computed, seconds = cache.computed, cache.seconds
                for p in tasks:
                    data[p] = [tasks[p].client_dataset_fn(cid, t) for cid in ids]
                prefix_rows.append({"examples": cache.computed - computed,
                                    "seconds": cache.seconds - seconds})
                kind = processes["tff"].round_name(states["tff"])
                for p in ("previous", "tff"):
                    result, row = meter.measure(
                        lambda p=p: processes[p].next_round(states[p], data[p]))
                    states[p] = result.state
                    row["loss"] = _leaf(result.metrics, "loss")
                    rows[p].append(row)
                with runtime.installed(in_process):
                    result, row = meter.measure(
                        lambda s=distributed_state: processes["tff"].next_round(s, data["tff"]))
                distributed_state = result.state
                row["loss"] = _leaf(result.metrics, "loss")
                rows["distribute"].append(row)
                for p, source in (("plain_uncached", "previous"), ("plain_cached", "tff")):
                    loss, row = meter.measure(lambda p=p, s=source: plain[p].round(kind, data[s]))
                    row["loss"] = loss
                    rows[p].append(row)
                log(f"  {algorithm} round {t + 1} ({kind}): " + ", ".join(
                    f"{p} {rows[p][-1]['seconds']:.2f} s" for p in rows)
                    + f"; h_3 of {prefix_rows[-1]['examples']} new examples "
                      f"{prefix_rows[-1]['seconds']:.2f} s")
            # Same computation: the TFF paths' trained weights against their plain twins.
            diffs = {}
            for p, plain_name in (("previous", "plain_uncached"), ("tff", "plain_cached")):
                got = processes[p].model_weights(states[p]).trainable
                diffs[p] = max(float(np.max(np.abs(np.asarray(a) - b)))
                               for a, b in zip(got, plain[plain_name].weights))
            distribute_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                  for a, b in zip(processes["tff"].model_weights(
                                      distributed_state).trainable, processes["tff"].model_weights(
                                      states["tff"]).trainable))
            state_io = measure.state_round_trip_seconds(
                processes["tff"].get_model_weights.type_signature.result,
                processes["tff"].get_model_weights(states["tff"]))
            mean = {p: _mean_after_first(r, "seconds") for p, r in rows.items()}
            cpu = {p: _mean_after_first(r, "cpu_seconds") for p, r in rows.items()}
            prefix_all.extend(prefix_rows)
            new = [r for r in prefix_all if r["examples"]]
            per_example = (sum(r["seconds"] for r in new) / sum(r["examples"] for r in new)
                           if new else float("nan"))
            first_epoch = mean["tff"] + per_example * config.num_clients * (
                config.local_steps * config.batch_size)
            out["algorithms"][algorithm] = {
                "seconds_per_round": mean, "cpu_seconds_per_round": cpu, "rounds": rows,
                "prefix": prefix_rows, "prefix_seconds_per_example": per_example,
                "round_time_vs_previous_path": mean["tff"] / mean["previous"],
                "round_time_vs_previous_path_first_epoch": first_epoch / mean["previous"],
                "round_time_vs_plain_uncached": mean["tff"] / mean["plain_uncached"],
                "cpu_vs_plain_cached": cpu["tff"] / cpu["plain_cached"],
                "round_time_vs_plain_cached": mean["tff"] / mean["plain_cached"],
                "state_io_seconds": state_io, "max_weight_diff_vs_plain": diffs,
                "distribute_vs_tff_round_time": mean["distribute"] / mean["tff"],
                "distribute_devices": in_process.devices,
                "max_weight_diff_distribute_vs_tff": distribute_diff,
            }
            log(f"  {algorithm}: " + json.dumps({k: round(v, 3) for k, v in
                                                 out["algorithms"][algorithm].items()
                                                 if isinstance(v, float)}))
            tf.keras.backend.clear_session()
    return out


def run_scaling(config: TargetsConfig, log) -> dict:
    """Peak RSS during 2 FedAvg-LoRA rounds of n clients × 2 steps (default path, MiniLM), each
    n in a fresh Python process (with its own worker), so that neither inherits the other's
    memory."""
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    out = {}
    for n in config.scaling_clients:
        code = ("import json, sys; from experiments.benchmark import targets as b; "
                f"print(json.dumps(b.scaling_child({n}, {config.data_dir!r})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=repo)
        if proc.returncode != 0:
            raise RuntimeError(f"the {n}-client scaling run failed: "
                               f"{proc.stderr.strip().splitlines()[-1:]}")
        out[n] = json.loads(proc.stdout.strip().splitlines()[-1])
        log(f"[scaling] {n} clients: peak {out[n]['peak_mb']:.0f} MB "
            f"({', '.join(f'{k} {v:.0f}' for k, v in out[n]['peak_mb_by_process'].items())}; "
            f"h_k cache {out[n]['prefix_cache_mb']:.0f} MB), rounds "
            f"{', '.join(f'{s:.1f}' for s in out[n]['seconds_per_round'])} s")
    small, big = config.scaling_clients
    return {"clients": out, "memory_200_vs_10": out[big]["peak_mb"] / out[small]["peak_mb"]}


def scaling_child(n: int, data_dir: str) -> dict:
    """One scaling configuration in this (fresh) process: 2 rounds of n clients × 2 steps."""
    from experiments.benchmark import measure
    from experiments import cli
    from tasks import registry
    from experiments import algorithms
    from tffl import runtime

    cli.quiet_python_logs()
    config = TargetsConfig(data_dir=data_dir)
    task = registry.build_task(
        "sst2", num_clients=n, batch_size=config.batch_size, local_steps=2, seed=config.seed,
        data_dir=config.data_dir, backbone="minilm", rank=config.rank,
        lora_layers=config.lora_layers, sequence_length=config.sequence_length)
    process = algorithms.build_algorithm("fedavg_lora", task, config.learning_rate)
    with measure.PeakSampler() as sampler, runtime.local_runtime():
        pids = runtime.running_workers()
        sampler.watch("worker", pids[0] if pids else None)
        meter = Meter(sampler, None)
        state = process.initialize()
        rows = []
        for t in range(2):
            data = [task.client_dataset_fn(cid, t) for cid in task.client_ids[:n]]
            result, row = meter.measure(lambda: process.next(state, data))
            state = result.state
            rows.append(row)
    peak = max(rows, key=lambda r: r["peak_mb"])
    return {"peak_mb": peak["peak_mb"], "peak_mb_by_process": peak["peak_mb_by_process"],
            "seconds_per_round": [r["seconds"] for r in rows],
            "prefix_cache_mb": _cache_mb(task.prefix_cache)}


def _cache_mb(cache) -> float:
    if cache is None:
        return 0.0
    return sum(h.nbytes for store in cache._hidden.values() for h in store
               if h is not None) / 2**20


def _large_model_fn(config: TargetsConfig):
    from models import backbones
    from models import lora_targets

    lora = lora_targets.LoraConfig(rank=config.rank, targets=("query", "value"),
                                   layers=config.large_layers, seed=config.seed)

    def model_fn():
        backbone = backbones.build_roberta_backbone(
            vocabulary_size=50265, num_layers=24, num_heads=16, hidden_dim=1024,
            intermediate_dim=4096, max_sequence_length=max(config.sequence_length, 8))
        lora_targets.apply_lora(backbone, lora)
        return backbones.build_classifier(backbone, 2, seed=config.seed)

    return model_fn, lora


def _large_clients(config: TargetsConfig, clients: int = 2):
    """Random token ids at the lengths of real SST-2 sentences (no RoBERTa tokenizer offline)."""
    import collections

    from tasks import prefix_cache

    lengths = _sst2_lengths(config)
    rng = np.random.default_rng(config.seed)
    out = {}
    for i in range(clients):
        n = 2 * config.batch_size
        length = rng.choice(lengths, n)
        mask = (np.arange(config.sequence_length)[None, :] < length[:, None]).astype(np.int32)
        tokens = rng.integers(3, 50265, mask.shape).astype(np.int32) * mask
        features = collections.OrderedDict(padding_mask=mask, token_ids=tokens)
        out[str(i)] = prefix_cache.ClientExamples(features, rng.integers(0, 2, n).astype(np.int32))
    return out


def _sst2_lengths(config: TargetsConfig) -> np.ndarray:
    """Token counts (with [CLS] and [SEP], at most `sequence_length`) of SST-2's dev sentences
    under MiniLM's WordPiece vocabulary."""
    from models import checkpoints
    from tasks import task as task_lib
    from tasks import text as text_lib

    packer = text_lib.bert_packer(checkpoints.fetch_minilm() / "vocab.txt",
                                  config.sequence_length)
    task = task_lib.sst2_tsv_task(pathlib.Path(config.data_dir) / "sst2", packer, 1, seed=0)
    masks = [x["padding_mask"] for x, _ in task.global_test_data.as_numpy_iterator()]
    return np.array([int(m.sum()) for m in masks])


def run_large(config: TargetsConfig, log) -> dict:
    """2 RoLoRA rounds of 2 clients × 2 steps on the RoBERTa-large shape, cached and not."""
    import collections

    import tensorflow as tf

    from experiments.benchmark import measure
    from tasks import prefix_cache
    from tffl.engine import frozen as frozen_lib
    from tffl.algorithms import lora_fl
    from tffl import runtime

    model_fn, lora = _large_model_fn(config)
    spec = (collections.OrderedDict((k, tf.TensorSpec([None, None], tf.int32))
                                    for k in ("padding_mask", "token_ids")),
            tf.TensorSpec([None], tf.int32))
    clients = _large_clients(config)
    started = time.perf_counter()
    values = frozen_lib.initial_values(model_fn, spec)
    draw_seconds = time.perf_counter() - started
    parameters = sum(v.size for v in values[0] + values[1])
    log(f"[large] RoBERTa-large shape: {parameters:,} parameters drawn in {draw_seconds:.0f} s")
    out = {"parameters": int(parameters), "lora_layers": list(config.large_layers)}
    for path in ("cached", "uncached"):
        with measure.PeakSampler() as sampler, runtime.local_runtime():
            pids = runtime.running_workers()
            sampler.watch("worker", pids[0] if pids else None)
            meter = Meter(sampler, None)
            started = time.perf_counter()
            if path == "cached":
                cached = prefix_cache.split_for_cache(model_fn, lambda: values, lora, 2,
                                                      config.seed, spec[1])
                process = lora_fl.build_lora_process(
                    "rolora", cached.keras_model_fn, cached.input_spec, config.learning_rate,
                    initial_non_trainable=cached.non_trainable())
                rounds = prefix_cache.TextRounds(clients, 2, config.batch_size, config.seed,
                                                 cache=cached.cache)
            else:
                process = lora_fl.build_lora_process(
                    "rolora", model_fn, spec, config.learning_rate,
                    initial_non_trainable=values[1])
                rounds = prefix_cache.TextRounds(clients, 2, config.batch_size, config.seed)
            build_seconds = time.perf_counter() - started
            state = process.initialize()
            rows, prefix_seconds = [], 0.0
            for t in range(2):
                before = rounds.cache.seconds if rounds.cache else 0.0
                data = [rounds.dataset(cid, t) for cid in clients]
                prefix_seconds += (rounds.cache.seconds if rounds.cache else 0.0) - before
                result, row = meter.measure(lambda: process.next(state, data))
                state = result.state
                rows.append(row)
            peak = sampler.take().get("total", 0) / 2**20
        steps = 2 * len(clients)  # per round: 2 clients × 2 steps, run by the worker
        out[path] = {
            "build_seconds": build_seconds, "prefix_seconds": prefix_seconds,
            "seconds_per_round": [r["seconds"] for r in rows],
            # Round 2 (compiled); the worker runs the 2 clients at once on the 2 cores.
            "seconds_per_step": rows[-1]["seconds"] / steps,
            "peak_mb": max([r["peak_mb"] for r in rows] + [peak]),
        }
        times = ", ".join(f"{r['seconds']:.1f}" for r in rows)
        log(f"[large] {path}: rounds {times} s, "
            f"{out[path]['seconds_per_step']:.2f} s/step, peak {out[path]['peak_mb']:.0f} MB")
        tf.keras.backend.clear_session()
    return out


def run_targets(config: TargetsConfig, output_dir: pathlib.Path, log=print) -> dict:
    """Runs the three parts, writes `output_dir/benchmark.json` and `benchmark.md`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    unknown = set(config.parts) - {"scaling", "main", "large"}
    if unknown or not config.parts:
        raise ValueError(f"targets parts {sorted(unknown) or '(none)'}: choose from scaling, main, "
                         "large")
    # scaling first: this process's memory is then the smallest
    scaling = run_scaling(config, log) if "scaling" in config.parts else None
    main = run_main(config, log) if "main" in config.parts else None
    large = run_large(config, log) if "large" in config.parts else None
    result = {}
    if main is not None:
        algorithms = main["algorithms"].values()
        result.update({
            "round_time_vs_previous_path": max(a["round_time_vs_previous_path"]
                                               for a in algorithms),
            "round_time_vs_plain_uncached": max(a["round_time_vs_plain_uncached"]
                                                for a in algorithms),
            "cpu_vs_plain_cached": max(a["cpu_vs_plain_cached"] for a in algorithms),
            "state_io_seconds": max(a["state_io_seconds"] for a in algorithms),
            "distribute_vs_tff_round_time": max(a["distribute_vs_tff_round_time"]
                                                for a in algorithms),
        })
    if scaling is not None:
        result["memory_200_vs_10"] = scaling["memory_200_vs_10"]
    if large is not None:
        result["large_seconds_per_step"] = large["cached"]["seconds_per_step"]
        result["large_peak_mb"] = large["cached"]["peak_mb"]
    result.update({"targets": TARGETS, "parts": list(config.parts), "main": main,
                   "scaling": scaling, "large": large,
                   "seconds": time.perf_counter() - started})
    result["met"] = {k: result[k] <= v for k, v in TARGETS.items() if k in result}
    if large is not None:
        result["met"]["large_peak_mb"] = result["large_peak_mb"] <= LARGE_MEMORY_LIMIT_MB
    (output_dir / "benchmark.json").write_text(json.dumps(result, indent=2, default=float))
    (output_dir / "benchmark.md").write_text(format_targets(result))
    log(format_targets(result))
    return result


def format_targets(result: dict) -> str:
    lines = ["| measure | value | target | met |", "|---|---|---|---|"]
    for key, target in TARGETS.items():
        if key in result:
            lines.append(f"| {key} | {result[key]:.3f} | <= {target:.3g} | {result['met'][key]} |")
    if "distribute_vs_tff_round_time" in result:
        lines.append(f"| distribute_vs_tff_round_time | {result['distribute_vs_tff_round_time']:.3f}"
                     " | reported | |")
    if "large_seconds_per_step" in result:
        lines.append(f"| large_seconds_per_step | {result['large_seconds_per_step']:.2f} | "
                     "reported | |")
        lines.append(f"| large_peak_mb | {result['large_peak_mb']:.0f} | <= "
                     f"{LARGE_MEMORY_LIMIT_MB} | {result['met']['large_peak_mb']} |")
    rows = []
    if result.get("main"):
        rows = ["", "| algorithm | path | s/round | CPU s/round |", "|---|---|---|---|"]
        for algorithm, a in result["main"]["algorithms"].items():
            for path, seconds in a["seconds_per_round"].items():
                rows.append(f"| {algorithm} | {path} | {seconds:.2f} | "
                            f"{a['cpu_seconds_per_round'][path]:.2f} |")
    return "\n".join(lines + rows) + "\n"
