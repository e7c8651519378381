"""The benchmark's run: TFF and plain rounds, alternating in one process, per configuration
(backbone × algorithm × clients per round); see scripts/benchmark.py for what each figure spans."""

from __future__ import annotations

import contextlib
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

from experiments import cli
from experiments import machine
from experiments.benchmark.build import Built, build_process, client_datasets
from experiments.benchmark.config import BACKBONES, BackboneShape, Config
from experiments.benchmark.measure import (CompileCounter, PeakSampler, cpu_seconds, mean,
                                           state_round_trip_seconds,
                                           profile_text, profile_summary, profile_tff_call)
from experiments.benchmark.plain import PlainRunner
from experiments.benchmark.report import evaluate_targets
from tffl import runtime


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return float(max((np.max(np.abs(np.asarray(x) - np.asarray(y))) if np.size(x) else 0.0)
                     for x, y in zip(a, b, strict=True)))


def run_configuration(built: Built, num_clients: int, datasets: Sequence[tf.data.Dataset],
                      model: tf.keras.Model, config: Config, sampler: PeakSampler,
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
    from tffl.simulation import participation
    from tffl.simulation import driver as simulation

    process = built.process
    plain = {"plain": PlainRunner(built, model, config, jit_compile=False)}
    if config.jit_compile:
        plain["plain_xla"] = PlainRunner(built, model, config, jit_compile=True)
    if any(epochs > 1 for s in built.sub_rounds for _, epochs in s.phases):
        # The same loop without `tffl.engine.feature_cache`: head-only epochs through the whole model.
        plain["plain_nocache"] = PlainRunner(built, model, config, jit_compile=False,
                                             cache_features=False)
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
                        cpu=cpu_seconds(me), worker_cpu=cpu_seconds(worker),
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
            tff_cpu_py.append(cpu_seconds(me) - mark["cpu"])
            tff_cpu_worker.append(cpu_seconds(worker) - mark["worker_cpu"])
            model_fn_calls.append(built.model_fn_calls.value - mark["calls"])
            compile_calls.append(compiles.calls - mark["compiles"])
            check_traffic(rows)
            rows.clear()
            for name, runner in plain.items():
                sampler.take()
                cpu0 = cpu_seconds(me)
                started = time.perf_counter()
                runner.round(datasets)
                plain_times[name].append(time.perf_counter() - started)
                plain_cpu[name].append(cpu_seconds(me) - cpu0)
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
            log=None, tensorboard=False, after_round=after_round, initial_state=state,
            prefetch=False)  # the datasets are pre-built; a round's first request starts its span
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
                        out = process.next_round(state, datasets, personal)
                        state, personal = out.state, out.personal_states
                    else:
                        state = process.next_round(state, datasets).state

            profile_dir.mkdir(parents=True, exist_ok=True)
            profiler = profile_tff_call(context, tff_round)
            (profile_dir / f"{stem}_tff.txt").write_text(profile_text(profiler))
            profiles["tff"] = profile_summary(profiler)
            profiler = cProfile.Profile()
            profiler.runcall(plain["plain"].round, datasets)
            (profile_dir / f"{stem}_plain.txt").write_text(profile_text(profiler))
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
    tff_s = mean(tff_times[1:])
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
        row[f"{name}_seconds_per_round"] = mean(times[1:])
        row[f"{name}_round1_seconds"] = times[0]
        row[f"{name}_cpu_seconds"] = [round(t, 3) for t in plain_cpu[name]]
        row[f"{name}_traces_per_round"] = [traces[0]] + [b - a for a, b in zip(traces, traces[1:])]
        row[f"{name}_retraces_after_round2"] = traces[-1] - traces[min(1, len(traces) - 1)]
        row[f"{name}_peak_rss_bytes"] = plain_peak[name]
        row[f"{name}_bytes"] = dict(runner.bytes)
    row["overhead_ratio"] = tff_s / row["plain_seconds_per_round"]
    # CPU seconds (this process + the worker) per round, rounds 2..R: TFF's cost without the
    # effect of the worker running clients in parallel.
    row["cpu_overhead_ratio"] = (mean(tff_cpu_py[1:]) + mean(tff_cpu_worker[1:])) / mean(
        plain_cpu["plain"][1:])
    if "plain_xla" in plain:
        row["xla_speedup"] = row["plain_seconds_per_round"] / row["plain_xla_seconds_per_round"]
    if "plain_nocache" in plain:
        row["feature_cache_speedup"] = (row["plain_nocache_seconds_per_round"]
                                        / row["plain_seconds_per_round"])
    return row


def run_benchmark(config: Config, log: Callable[[str], None] = print,
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
        "machine": {**machine.describe(), "load_average_at_start": load_at_start,
                    "load_average_at_end": _load()},
    }
