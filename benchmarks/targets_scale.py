"""`--suite=targets`'s scaling and large parts (benchmarks/targets.py): peak memory with
n clients per round, each n in a fresh process, and RoLoRA rounds on a RoBERTa-large-shaped
backbone (random weights), cached and not."""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from benchmarks.config import TargetsConfig


def run_scaling(config: TargetsConfig, log) -> dict:
    """Peak RSS during 2 FedAvg-LoRA rounds of n clients × 2 steps (default path, MiniLM), each
    n in a fresh Python process (with its own worker), so that neither inherits the other's
    memory."""
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    out = {}
    for n in config.scaling_clients:
        code = ("import json; from benchmarks import targets_scale; "
                f"print(json.dumps(targets_scale.scaling_child({n}, {config.data_dir!r})))")
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
    from benchmarks import measure
    from runner import algorithms
    from runner import cli
    from runner.run_config import RunConfig
    from tasks import registry
    from tasks.task_config import TaskSpec
    from tffl import runtime
    from tffl.runtime import workers

    cli.quiet_python_logs()
    config = TargetsConfig(data_dir=data_dir)
    task = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=n,
        batch_size=config.batch_size, local_steps=2, seed=config.seed, data_dir=config.data_dir,
        backbone="minilm", rank=config.rank, lora_layers=config.lora_layers,
        sequence_length=config.sequence_length, partition="iid"))
    process = algorithms.build_algorithm(
        "fedavg_lora", task, RunConfig().with_changes(learning_rate=config.learning_rate))
    with measure.PeakSampler() as sampler, runtime.local_runtime():
        pids = workers.running_workers()
        sampler.watch("worker", pids[0] if pids else None)
        meter = measure.Meter(sampler, None)
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
    """MB of the prefix outputs (h_k) held by `cache` (0 without one)."""
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

    from tffl.engine import frozen as frozen_lib

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
        out[path] = _run_large_path(path, config, model_fn, lora, spec, values, clients)
        times = ", ".join(f"{s:.1f}" for s in out[path]["seconds_per_round"])
        log(f"[large] {path}: rounds {times} s, "
            f"{out[path]['seconds_per_step']:.2f} s/step, peak {out[path]['peak_mb']:.0f} MB")
        tf.keras.backend.clear_session()
    return out


def _build_large_path(path: str, config: TargetsConfig, model_fn, lora, spec, values, clients):
    """The RoLoRA process and the clients' rounds of one path: `cached`, the suffix fed the cached
    prefix outputs; `uncached`, the whole model."""
    from tasks import batching, prefix_cache
    from tffl.algorithms import lora_fl

    if path == "cached":
        cached = prefix_cache.split_for_cache(
            model_fn, lambda: values[1], prefix_cache.ClassifierLayout(lora, 2, config.seed),
            spec[1])
        process = lora_fl.build_lora_process(
            "rolora", cached.keras_model_fn, cached.input_spec, config.learning_rate,
            initial_non_trainable=cached.non_trainable())
        rounds = prefix_cache.TextRounds(
            clients, prefix_cache.RoundDraw(2, config.batch_size, config.seed,
                                            width_multiple=batching.WIDTH_MULTIPLE),
            cache=cached.cache)
    else:
        process = lora_fl.build_lora_process(
            "rolora", model_fn, spec, config.learning_rate,
            initial_non_trainable=values[1])
        rounds = prefix_cache.TextRounds(clients, prefix_cache.RoundDraw(
            2, config.batch_size, config.seed, width_multiple=batching.WIDTH_MULTIPLE))
    return process, rounds


def _run_large_path(path: str, config: TargetsConfig, model_fn, lora, spec, values,
                    clients) -> dict:
    """2 rounds of one path on a fresh worker: build and round seconds, peak memory."""
    from benchmarks import measure
    from tffl import runtime
    from tffl.runtime import workers

    with measure.PeakSampler() as sampler, runtime.local_runtime():
        pids = workers.running_workers()
        sampler.watch("worker", pids[0] if pids else None)
        meter = measure.Meter(sampler, None)
        started = time.perf_counter()
        process, rounds = _build_large_path(path, config, model_fn, lora, spec, values, clients)
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
    return {
        "build_seconds": build_seconds, "prefix_seconds": prefix_seconds,
        "seconds_per_round": [r["seconds"] for r in rows],
        # Round 2 (compiled); the worker runs the 2 clients at once on the 2 cores.
        "seconds_per_step": rows[-1]["seconds"] / steps,
        "peak_mb": max([r["peak_mb"] for r in rows] + [peak]),
    }
