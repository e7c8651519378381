"""`scripts/benchmark.py --suite=targets`: the performance targets' measurements, one run.

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
* `plain_uncached`: the benchmark's plain loop (`benchmarks.plain.PlainLoop`: one eager Keras
  model, each client the engine's own client loop over a `tf.data` iterator in a
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
`tffl.runtime.distribute.DistributeContext` (the same computations in this process under a
tf.distribute strategy, `TargetsConfig.devices`) instead of the TFF worker;
`distribute_vs_tff_round_time` is its mean round time over the worker's.

Top-level keys of benchmark.json: `round_time_vs_previous_path`, `round_time_vs_plain_uncached`,
`cpu_vs_plain_cached`, `state_io_seconds`, `distribute_vs_tff_round_time` (each the worse of the
two algorithms), `memory_200_vs_10`, `large_seconds_per_step`, `large_peak_mb`; details under
`main`, `scaling`, `large`. `TargetsConfig.parts` (`--targets_parts`) runs a subset; the keys of
the parts not run are absent. **Evaluation** (`--targets_parts=evaluation`, not in the default
parts: it loads Gemma 3 270M, about 1 GB): `evaluation_seconds`, the seconds of `sst2_instruct`'s
872-sentence dev evaluation (`benchmarks.evaluation`), details under `evaluation`, with
multi-token generation's seconds with and without the key/value cache (`evaluation.generation`).
**Start-up** (`--targets_parts=startup`, not in the default parts either: each of
`--startup_models`, Gemma 3 270M and MiniLM, for 8 rounds, twice): `startup_steady_none_vs_tff`,
the later rounds' seconds without TFF's Grappler pass over those with it (the largest of the
models), and each model's and choice's first B and A rounds (`benchmarks.startup`), under
`startup`. **Peer**
(`--targets_parts=peer`, not in the default parts: it needs a Python with torch, transformers and
peft, `--peer_python`): tffl's FedAvg-LoRA beside a Transformers + PEFT FedAvg loop on the same
batches, on MiniLM and Gemma 3 270M (`--peer_models`) at N = 3 and 20 (`benchmarks.peer`):
`peer_seconds_ratio` and `peer_memory_ratio`, tffl's seconds per client step and peak memory over
the peer's (the largest of the runs), and `peer_training_memory_ratio`, tffl's peak before its
one dev evaluation over the peer's (which evaluates nothing), details under `peer`. **Baseline**
(`--targets_parts=baseline`, not in the default parts: it needs `--baseline_checkout`, a clone at
the commit compared with): `round_time_vs_baseline`, RoLoRA's later rounds on Gemma 3 270M in
this checkout over the same rounds in the other (`benchmarks.baseline`), details under
`baseline`.

This module runs the main setting and writes the results; `benchmarks.plain` holds the plain
loop, `benchmarks.targets_scale` the scaling and large parts, `benchmarks.config` the
`TargetsConfig`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import numpy as np

from benchmarks.baseline import run_baseline
from benchmarks.config import LARGE_MEMORY_LIMIT_MB, TARGETS, TARGETS_PARTS, TargetsConfig
from benchmarks.evaluation import run_evaluation
from benchmarks.peer import run_peer
from benchmarks.plain import PlainLoop, lora_sub_rounds
from benchmarks.startup import run_startup
from benchmarks.targets_scale import run_large, run_scaling

# The main setting's paths, in the order of their rows (and of the log and the results).
PATHS = ("previous", "tff", "distribute", "plain_uncached", "plain_cached")
# Each TFF path's plain twin: the same rounds in a plain loop.
PLAIN_TWINS = (("previous", "plain_uncached"), ("tff", "plain_cached"))


def _leaf(metrics, name: str) -> float:
    """The first non-dict value under key `name` in nested `metrics` (NaN if none)."""
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            if key == name and not isinstance(value, dict):
                return float(value)
            found = _leaf(value, name)
            if found == found:
                return found
    return float("nan")


def _mean_after_first(rows: list[dict], key: str) -> float:
    """The mean of `key` over rounds 2.. (round 1 traces and compiles)."""
    values = [r[key] for r in rows[1:]]
    return float(np.mean(values)) if values else float("nan")


# ------------------------------------------------------------------------------------------------
# The main setting


@dataclasses.dataclass
class _MainPaths:
    """One algorithm's paths in the main setting: the TFF processes and states of `previous` and
    `tff`, the `distribute` path's state (the `tff` process in this process), the plain loops,
    and each path's rows (one per round)."""

    processes: dict
    states: dict
    distributed_state: object
    plain: dict[str, PlainLoop]
    rows: dict[str, list[dict]]


def run_main(config: TargetsConfig, log) -> dict:
    """The main setting: four paths × the algorithms, rounds alternating."""
    import psutil
    import tensorflow as tf

    from benchmarks import measure
    from tffl import runtime
    from tffl.runtime import distribute, workers

    tasks = _build_main_tasks(config, log)
    out = {"setting": dataclasses.asdict(config), "algorithms": {}}
    prefix_all = []  # h_3 computations of every round: the cache is shared by the algorithms
    # The in-process runtime runs the "tff" path's process on the same data; one
    # context for all rounds, so that its compiled computations are reused as the worker's are.
    in_process = distribute.DistributeContext(distribute.build_strategy(config.devices))
    with measure.PeakSampler() as sampler, runtime.local_runtime():
        pids = workers.running_workers()
        worker = psutil.Process(pids[0]) if pids else None
        sampler.watch("worker", pids[0] if pids else None)
        meter = measure.Meter(sampler, worker)
        for algorithm in config.algorithms:
            figures = _run_main_algorithm(config, algorithm, tasks, meter, in_process,
                                          prefix_all, log)
            out["algorithms"][algorithm] = figures
            log(f"  {algorithm}: " + json.dumps({k: round(v, 3) for k, v in figures.items()
                                                 if isinstance(v, float)}))
            tf.keras.backend.clear_session()
    return out


def _build_main_tasks(config: TargetsConfig, log) -> dict:
    """The SST-2 tasks of the `previous` path (whole model, padded) and the `tff` path (the
    cached prefix, batches bucketed by length)."""
    from tasks import registry
    from tasks.task_config import TaskSpec

    tasks = {}
    for name, cached in (("previous", False), ("tff", True)):
        started = time.perf_counter()
        tasks[name] = registry.build_run_task(TaskSpec().with_changes(task="sst2",
            num_clients=config.num_clients, batch_size=config.batch_size,
            local_steps=config.local_steps, seed=config.seed, data_dir=config.data_dir,
            backbone="minilm", rank=config.rank, lora_layers=config.lora_layers,
            sequence_length=config.sequence_length, prefix_cache=cached, bucket_by_length=cached, partition="iid"))
        log(f"[{name}] {tasks[name].description} ({time.perf_counter() - started:.0f} s)")
    return tasks


def _start_main_paths(config: TargetsConfig, algorithm: str, tasks: dict) -> _MainPaths:
    """Every path of `algorithm` at the same initial weights."""
    from runner import algorithms
    from runner.run_config import RunConfig

    run = RunConfig().with_changes(learning_rate=config.learning_rate)
    processes = {p: algorithms.build_algorithm(algorithm, tasks[p], run) for p in tasks}
    states = {p: processes[p].initialize() for p in tasks}
    plain = {}
    for p, plain_name in PLAIN_TWINS:
        weights = processes[p].model_weights(states[p])
        plain[plain_name] = PlainLoop(tasks[p].keras_model_fn(), config.learning_rate,
                                      lora_sub_rounds(processes[p].spec, algorithm))
        plain[plain_name].reset(weights.trainable, weights.non_trainable)
    return _MainPaths(processes, states, states["tff"], plain, {p: [] for p in PATHS})


def _run_main_algorithm(config: TargetsConfig, algorithm: str, tasks: dict, meter, in_process,
                        prefix_all: list[dict], log) -> dict:
    """`config.rounds` rounds of every path of `algorithm`, alternating; returns its figures.
    `prefix_all` collects the h_3 computations of every algorithm's rounds."""
    paths = _start_main_paths(config, algorithm, tasks)
    ids = tasks["tff"].client_ids[:config.num_clients]
    prefix_rows = []
    for t in range(config.rounds):
        data = _round_data(tasks, ids, t, prefix_rows)
        kind = paths.processes["tff"].round_name(paths.states["tff"])
        _run_tff_rounds(paths, data, meter, in_process)
        _run_plain_rounds(paths, kind, data, meter)
        log(f"  {algorithm} round {t + 1} ({kind}): " + ", ".join(
            f"{p} {paths.rows[p][-1]['seconds']:.2f} s" for p in paths.rows)
            + f"; h_3 of {prefix_rows[-1]['examples']} new examples "
              f"{prefix_rows[-1]['seconds']:.2f} s")
    return _main_figures(config, paths, prefix_rows, prefix_all, in_process)


def _round_data(tasks: dict, ids, t: int, prefix_rows: list[dict]) -> dict:
    """Round t's client datasets of each task; appends the h_3 computations they made (new
    examples, seconds) to `prefix_rows`."""
    cache = tasks["tff"].prefix_cache
    data = {p: None for p in tasks}
    computed, seconds = cache.computed, cache.seconds
    for p in tasks:
        data[p] = [tasks[p].client_dataset_fn(cid, t) for cid in ids]
    prefix_rows.append({"examples": cache.computed - computed,
                        "seconds": cache.seconds - seconds})
    return data


def _run_tff_rounds(paths: _MainPaths, data: dict, meter, in_process) -> None:
    """One round of `previous` and `tff` on the worker, then `tff`'s process in this process."""
    from tffl import runtime

    processes, states = paths.processes, paths.states
    for p in ("previous", "tff"):
        result, row = meter.measure(lambda p=p: processes[p].next_round(states[p], data[p]))
        states[p] = result.state
        row["loss"] = _leaf(result.metrics, "loss")
        paths.rows[p].append(row)
    with runtime.installed(in_process):
        result, row = meter.measure(
            lambda s=paths.distributed_state: processes["tff"].next_round(s, data["tff"]))
    paths.distributed_state = result.state
    row["loss"] = _leaf(result.metrics, "loss")
    paths.rows["distribute"].append(row)


def _run_plain_rounds(paths: _MainPaths, kind: str, data: dict, meter) -> None:
    """One round of `kind` of each plain loop on its TFF twin's data."""
    for p, source in (("plain_uncached", "previous"), ("plain_cached", "tff")):
        loss, row = meter.measure(lambda p=p, s=source: paths.plain[p].round(data[s], kind))
        row["loss"] = loss
        paths.rows[p].append(row)


def _max_abs_diff(a, b) -> float:
    """The largest absolute difference between two lists of weight arrays."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def _main_figures(config: TargetsConfig, paths: _MainPaths, prefix_rows: list[dict],
                  prefix_all: list[dict], in_process) -> dict:
    """One algorithm's figures: mean seconds per round, the ratios, state I/O, and the weight
    differences that show the paths did the same computation."""
    from benchmarks import measure

    processes, states, rows = paths.processes, paths.states, paths.rows
    # Same computation: the TFF paths' trained weights against their plain twins.
    diffs = {p: _max_abs_diff(processes[p].model_weights(states[p]).trainable,
                              paths.plain[plain_name].trainable)
             for p, plain_name in PLAIN_TWINS}
    distribute_diff = _max_abs_diff(
        processes["tff"].model_weights(paths.distributed_state).trainable,
        processes["tff"].model_weights(states["tff"]).trainable)
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
    return {
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


# ------------------------------------------------------------------------------------------------
# The suite


def run_targets(config: TargetsConfig, output_dir: pathlib.Path, log=print) -> dict:
    """Runs the parts `config.parts` names; writes `output_dir/benchmark.json` and
    `benchmark.md`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    unknown = set(config.parts) - set(TARGETS_PARTS)
    if unknown or not config.parts:
        raise ValueError(f"targets parts {sorted(unknown) or '(none)'}: choose from "
                         f"{', '.join(TARGETS_PARTS)}")
    # scaling first: this process's memory is then the smallest
    scaling = run_scaling(config, log) if "scaling" in config.parts else None
    main = run_main(config, log) if "main" in config.parts else None
    large = run_large(config, log) if "large" in config.parts else None
    evaluation = run_evaluation(config, log) if "evaluation" in config.parts else None
    startup = run_startup(config, output_dir, log) if "startup" in config.parts else None
    peer = run_peer(config, output_dir, log) if "peer" in config.parts else None
    baseline = run_baseline(config, output_dir, log) if "baseline" in config.parts else None
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
    if evaluation is not None:
        result["evaluation_seconds"] = evaluation["seconds"]
    if startup is not None:
        result["startup_steady_none_vs_tff"] = max(m["steady_none_vs_tff"]
                                                   for m in startup.values())
    measured = [v for v in (peer or {}).values() if isinstance(v, dict) and "seconds_ratio" in v]
    if measured:
        result["peer_seconds_ratio"] = max(v["seconds_ratio"] for v in measured)
        result["peer_memory_ratio"] = max(v["memory_ratio"] for v in measured)
        result["peer_training_memory_ratio"] = max(v["training_memory_ratio"] for v in measured)
    if baseline is not None:
        result["round_time_vs_baseline"] = baseline["round_time_vs_baseline"]
    result.update({"targets": TARGETS, "parts": list(config.parts), "main": main,
                   "scaling": scaling, "large": large, "evaluation": evaluation,
                   "startup": startup, "peer": peer, "baseline": baseline,
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
    if "startup_steady_none_vs_tff" in result:
        lines.append(f"| startup_steady_none_vs_tff | {result['startup_steady_none_vs_tff']:.3f}"
                     " | reported | |")
        for model, choices in result["startup"].items():
            lines.append(f"| startup {model}: later rounds none / tff | "
                         f"{choices['steady_none_vs_tff']:.3f} | reported | |")
            for choice in ("tff", "none"):
                s = choices[choice]
                lines.append(f"| startup {model} {choice}: first B, first A, later rounds (s) | "
                             f"{s['first_b_round_seconds']:.1f}, "
                             f"{s['first_a_round_seconds']:.1f}, "
                             f"{s['steady_round_seconds']:.2f} | reported | |")
    if "peer_seconds_ratio" in result:
        for key in ("peer_seconds_ratio", "peer_memory_ratio", "peer_training_memory_ratio"):
            lines.append(f"| {key} | {result[key]:.3f} | reported | |")
        for name, v in result["peer"].items():
            if isinstance(v, dict) and "seconds_ratio" in v:
                lines.append(
                    f"| peer {name}: s/client step, peak MB (tffl, and before its dev "
                    "evaluation; Transformers + PEFT) | "
                    f"{v['tffl']['seconds_per_client_step']:.3f}, {v['tffl']['peak_mb']:.0f}, "
                    f"{v['tffl']['training_peak_mb']:.0f}; "
                    f"{v['peft']['seconds_per_client_step']:.3f}, {v['peft']['peak_mb']:.0f} | "
                    "reported | |")
    if "round_time_vs_baseline" in result:
        for name in ("baseline", "this"):
            r = result["baseline"][name]
            lines.append(f"| baseline: {name} checkout ({r['commit']}): first B, first A, later "
                         f"rounds (s); driver, worker peak (MB) | "
                         f"{r['first_b_round_seconds']:.1f}, {r['first_a_round_seconds']:.1f}, "
                         f"{r['steady_round_seconds']:.2f}; {r['driver_peak_mb']:.0f}, "
                         f"{r['worker_peak_mb']:.0f} | reported | |")
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
