"""The benchmark's run: TFF and plain rounds, alternating in one process, per configuration
(backbone × algorithm × clients per round); see scripts/benchmark.py for what each figure spans."""

from __future__ import annotations

import cProfile
import dataclasses
import os
import pathlib
import pstats
import time
from collections.abc import Callable, Sequence

import numpy as np
import psutil
import tensorflow as tf

from benchmarks.build import Built, build_benchmarked, client_datasets
from benchmarks.config import BACKBONES, BackboneShape, BenchmarkConfig
from benchmarks.measure import (CompileCounter, PeakSampler, mean, profile_summary,
                                profile_text, profile_tff_call, state_round_trip_seconds)
from benchmarks.plain import PlainLoop
from benchmarks.report import evaluate_targets
from benchmarks.rounds import BenchmarkRounds, Measurements, merge_peaks
from runner import cli
from runner import machine
from tffl import runtime
from tffl.runtime import workers
from tffl.simulation import memory


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """The largest absolute difference between two lists of arrays (0 for empty arrays)."""
    return float(max((np.max(np.abs(np.asarray(x) - np.asarray(y))) if np.size(x) else 0.0)
                     for x, y in zip(a, b, strict=True)))


def _plain_loops(built: Built, model: tf.keras.Model, config: BenchmarkConfig) -> dict[str, PlainLoop]:
    """The plain loops of a configuration: `plain`, `plain_xla` with --jit_compile, and
    `plain_nocache` when a phase runs several epochs."""
    def loop(jit_compile: bool, cache_features: bool = True) -> PlainLoop:
        return PlainLoop(model, config.learning_rate, built.sub_rounds, built.personal,
                         jit_compile=jit_compile, cache_features=cache_features)

    plain = {"plain": loop(jit_compile=False)}
    if config.jit_compile:
        plain["plain_xla"] = loop(jit_compile=True)
    if any(epochs > 1 for s in built.sub_rounds for _, epochs in s.phases):
        # The same loop without `tffl.engine.feature_cache`: head-only epochs through the whole model.
        plain["plain_nocache"] = loop(jit_compile=False, cache_features=False)
    return plain


def run_configuration(built: Built, num_clients: int, datasets: Sequence[tf.data.Dataset],
                      model: tf.keras.Model, config: BenchmarkConfig, sampler: PeakSampler,
                      log: Callable[[str], None], output_dir: pathlib.Path | None = None
                      ) -> dict:
    """TFF and plain rounds, alternating, on a fresh TFF worker; returns the configuration's row.

    The TFF rounds run through `tffl.simulation.driver.run_rounds` (the one round driver): all
    `num_clients` clients every round (`FullParticipation` over ids "0".."n-1", client i's data
    `datasets[i]`), `rounds × len(built.sub_rounds)` communication rounds, one metrics row each.
    Its `after_round` callback closes a benchmark round after the last of its communication
    rounds: it takes the TFF measurements, then runs the plain rounds, so the two still
    alternate within one process. See the module docstring for what each TFF figure spans.

    The plain loops run on `model` (an eager model of the backbone) with `tf.function`s made for
    this configuration, so both paths trace (and XLA compiles) in their round 1."""
    process = built.process
    plain = _plain_loops(built, model, config)
    profile_dir = output_dir / "profiles" if config.profile and output_dir is not None else None
    stem = f"{built.backbone.name}_{built.algorithm.replace('+', '_')}_{num_clients}"
    datasets = list(datasets[:num_clients])
    compiles = CompileCounter()
    measured = Measurements.for_plain(plain)
    setup_started = time.perf_counter()
    with compiles.installed(), runtime.local_runtime(
            log_dir=output_dir, max_concurrent_calls=config.max_concurrent_calls) as context, \
            cli.run_directory(None if output_dir is None else output_dir / "tff_runs" / stem,
                              prefix=f"benchmark_{stem}_") as run_dir:
        pids = workers.running_workers()
        worker = psutil.Process(pids[0]) if pids else None
        sampler.watch("worker", pids[0] if pids else None)
        sampler.take()
        # The initial state: the plain loops' start, and run_rounds' (`initial_state`).
        state = process.initialize()
        weights = process.model_weights(state)  # the whole model: frozen weights included
        for loop in plain.values():
            loop.reset(weights.trainable, weights.non_trainable, num_clients)
        merge_peaks(measured.tff_peak, sampler.take())
        measured.setup_seconds = time.perf_counter() - setup_started
        rounds = BenchmarkRounds(built, plain, datasets, sampler, compiles, worker, measured,
                                  log)
        state, personal = _run_tff_rounds(built, rounds, num_clients, config, state, stem,
                                          run_dir)
        # State I/O: the federated weights (the server state's model), Python -> worker -> Python.
        state_io = state_round_trip_seconds(process.get_model_weights.type_signature.result,
                                            process.get_model_weights(state))
        diffs = _weight_diffs(built, process.model_weights(state), personal, plain)
        if profile_dir is not None:
            measured.profiles = _profile_round(built, context, state, personal, datasets,
                                               plain["plain"], profile_dir, stem)
        if worker is not None:
            _record_worker_hwm(worker, measured.tff_peak)
        sampler.watch("worker", None)
    return _configuration_row(built, num_clients, config, measured, state_io, diffs, plain)


def _run_tff_rounds(built: Built, rounds: BenchmarkRounds, num_clients: int, config: BenchmarkConfig,
                    state, stem: str, run_dir):
    """All benchmark rounds through run_rounds, from `state`; returns the final state and (for
    personalized algorithms) the clients' personal states."""
    from tffl.simulation import participation
    from tffl.simulation import driver

    total = config.rounds * rounds.per_round
    result = driver.run_rounds(
        built.process, participation.FullParticipation(rounds.client_ids), rounds.client_dataset,
        total, run_dir, driver.RunOptions(
            checkpoint_every=total,
            config=dataclasses.asdict(config) | dict(backbone=built.backbone.name,
                                                     algorithm=built.algorithm,
                                                     clients_per_round=num_clients),
            log=None, tensorboard=False, after_round=rounds.after_round, initial_state=state,
            # the datasets are pre-built; a round's first request starts its span
            prefetch=False))
    tff_times = rounds.measured.tff_times
    if len(result.history) != total or len(tff_times) != config.rounds:
        raise RuntimeError(f"{stem}: run_rounds ran {len(result.history)} communication "
                           f"rounds ({len(tff_times)} benchmark rounds), expected {total}")
    personal = (result.personal_store.lookup(rounds.client_ids) if built.personalized else None)
    return result.state, personal


def _weight_diffs(built: Built, tff_weights, personal, plain: dict[str, PlainLoop]
                  ) -> dict[str, float]:
    """Per plain loop, the largest difference from the TFF process's final weights (and, when
    personalized, from the clients' personal states): the plain loop did the same work."""
    diffs = {name: _max_diff(tff_weights.trainable, loop.trainable)
             for name, loop in plain.items()}
    if built.personalized:
        for name, loop in plain.items():
            diffs[name] = max(diffs[name], max(
                _max_diff(p, q) for p, q in zip(personal, loop.personal)))
    return diffs


def _profile_round(built: Built, context, state, personal, datasets: list[tf.data.Dataset],
                   plain_loop: PlainLoop, profile_dir: pathlib.Path, stem: str) -> dict:
    """One extra, profiled round of each side, written to `profile_dir`; returns the summaries.

    The TFF round calls the process directly, not through run_rounds: it is not one of the
    benchmark's rounds (nor timed), only cProfile's view of a round."""
    process = built.process

    def tff_round():
        nonlocal state, personal
        for _ in built.sub_rounds:  # one `next_round` per communication round (RoLoRA: B, A)
            if built.personalized:
                out = process.next_round(state, datasets, personal)
                state, personal = out.state, out.personal_states
            else:
                state = process.next_round(state, datasets).state

    profiles = {}
    profile_dir.mkdir(parents=True, exist_ok=True)
    profiler = profile_tff_call(context, tff_round)
    (profile_dir / f"{stem}_tff.txt").write_text(profile_text(profiler))
    profiles["tff"] = profile_summary(profiler)
    profiler = cProfile.Profile()
    profiler.runcall(plain_loop.round, datasets)
    (profile_dir / f"{stem}_plain.txt").write_text(profile_text(profiler))
    profiles["plain"] = {"total": round(max(
        (v[3] for v in pstats.Stats(profiler).stats.values()), default=0.0), 4)}
    return profiles


def _record_worker_hwm(worker: psutil.Process, tff_peak: dict[str, int]) -> None:
    """The worker's lifetime peak (it serves only this configuration) in bytes: exact on
    Linux (`tffl.simulation.memory.peak_rss_mb`), absent elsewhere."""
    peak_mb = memory.peak_rss_mb(worker.pid)
    if peak_mb is not None:
        tff_peak["worker_hwm"] = round(peak_mb * 1e6)


def _configuration_row(built: Built, num_clients: int, config: BenchmarkConfig, measured: Measurements,
                       state_io: float, diffs: dict[str, float],
                       plain: dict[str, PlainLoop]) -> dict:
    """The configuration's row: the TFF side's figures, then each plain loop's, then the ratios."""
    traffic = built.traffic
    down = sum(t.down for t in traffic.values())
    up = sum(t.up for t in traffic.values())
    m = measured
    tff_s = mean(m.tff_times[1:])
    row = {
        "backbone": built.backbone.name,
        "algorithm": built.algorithm,
        "clients_per_round": num_clients,
        "local_steps": config.local_steps,
        "sgd_steps_per_client": config.local_steps * sum(
            e for s in built.sub_rounds for _, e in s.phases),
        "build_seconds": round(built.build_seconds, 3),
        "tff_setup_seconds": round(m.setup_seconds, 3),
        "tff_round_seconds": [round(t, 6) for t in m.tff_times],
        "tff_driver_round_seconds": [round(t, 6) for t in m.tff_driver_times],
        "tff_seconds_per_round": tff_s,
        "tff_round1_seconds": m.tff_times[0],
        "tff_python_cpu_seconds": [round(t, 3) for t in m.tff_cpu_py],
        "tff_worker_cpu_seconds": [round(t, 3) for t in m.tff_cpu_worker],
        "tff_model_fn_calls_per_round": m.model_fn_calls,
        "tff_compilations_per_round": m.compile_calls,
        "tff_retraces_after_round2": sum(m.model_fn_calls[2:]) + sum(m.compile_calls[2:]),
        "tff_peak_rss_bytes": m.tff_peak,
        "tff_state_round_trip_seconds": state_io,
        "bytes_down_per_client": down,
        "bytes_up_per_client": up,
        "traffic_per_communication_round": {
            k: {"down": t.down, "up": t.up} for k, t in traffic.items()},
        "max_weight_diff": diffs,
        "profile": m.profiles,
    }
    for name, loop in plain.items():
        row.update(_plain_figures(name, loop, m))
    row["overhead_ratio"] = tff_s / row["plain_seconds_per_round"]
    # CPU seconds (this process + the worker) per round, rounds 2..R: TFF's cost without the
    # effect of the worker running clients in parallel.
    row["cpu_overhead_ratio"] = (mean(m.tff_cpu_py[1:]) + mean(m.tff_cpu_worker[1:])) / mean(
        m.plain_cpu["plain"][1:])
    if "plain_xla" in plain:
        row["xla_speedup"] = row["plain_seconds_per_round"] / row["plain_xla_seconds_per_round"]
    if "plain_nocache" in plain:
        row["feature_cache_speedup"] = (row["plain_nocache_seconds_per_round"]
                                        / row["plain_seconds_per_round"])
    return row


def _plain_figures(name: str, loop: PlainLoop, measured: Measurements) -> dict:
    """One plain loop's columns of the row, `<name>_...`."""
    times = measured.plain_times[name]
    traces = measured.plain_traces[name]
    return {
        f"{name}_round_seconds": [round(t, 6) for t in times],
        f"{name}_seconds_per_round": mean(times[1:]),
        f"{name}_round1_seconds": times[0],
        f"{name}_cpu_seconds": [round(t, 3) for t in measured.plain_cpu[name]],
        f"{name}_traces_per_round": [traces[0]] + [b - a for a, b in zip(traces, traces[1:])],
        f"{name}_retraces_after_round2": traces[-1] - traces[min(1, len(traces) - 1)],
        f"{name}_peak_rss_bytes": measured.plain_peak[name],
        f"{name}_bytes": dict(loop.bytes),
    }


def run_benchmark(config: BenchmarkConfig, log: Callable[[str], None] = print,
                  shapes: dict[str, BackboneShape] | None = None,
                  output_dir: pathlib.Path | None = None) -> dict:
    """Builds every process first (TFF traces Keras models in graphs, which invalidates eager
    Keras 2 models made before), then the eager plain models, then runs every configuration.
    Must NOT run inside a `runtime.local_runtime()`: each configuration starts its own worker."""
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
            built[b, algorithm] = build_benchmarked(algorithm, shapes[b], config)
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
        "machine": {**machine.describe(), "load_average_at_start": load_at_start,
                    "load_average_at_end": _load()},
    }
