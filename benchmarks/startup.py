"""`--suite=targets`'s start-up part (benchmarks/targets.py): how soon each round kind of a
RoLoRA run trains, and its later rounds' seconds, with TFF's Grappler pass over the graphs and
without it (`tffl.runtime.graph_optimization`), on each model of `TargetsConfig.startup_models`.

For each model and each choice of `GRAPH_OPTIMIZATIONS`, in this process one after the other,
`runner.run.run` (what scripts/train.py runs) trains RoLoRA at N = 3 (all clients every round)
for `STARTUP_ROUNDS` communication rounds, evaluating only after the last, at the budget of
`STARTUP_SETTINGS`: on Gemma 3 270M `sst2_instruct`'s (LoRA r = 8 on query and value of layers
14-17, 2 local steps of batch 8), on MiniLM `sst2_clients_mean`'s (r = 4 on query and value of
layers 3-5, mean pooling, a linear head, whole sentences, 10 local steps of batch 16).
Round 1 (a B round) and round 2 (an A round) each compile their round kind on first use: their
`round_seconds` are that kind's start-up plus one round. Rounds 3 on are steady. Reported per choice: those two
rounds' seconds, the steady rounds' mean, the driver's and the worker's peak resident memory
(`tffl.simulation.memory`), and the final metrics (the same rounds either way); per model,
`steady_none_vs_tff` is the steady mean without the pass over the mean with it.
"""

from __future__ import annotations

import pathlib

from benchmarks.config import TargetsConfig

STARTUP_ROUNDS = 8
# Each model's run (`RunConfig` fields): the experiments' budgets (module docstring).
STARTUP_SETTINGS = {
    "gemma3_270m": {"task": "sst2_instruct", "backbone": "gemma3_270m", "rank": 8,
                    "lora_layers": (14, 15, 16, 17), "local_steps": 2, "batch_size": 8,
                    "learning_rate": 0.1},
    "minilm": {"task": "sst2", "backbone": "minilm", "rank": 4, "lora_layers": (3, 4, 5),
               "pooling": "mean", "head": "linear", "local_steps": 10, "batch_size": 16,
               "learning_rate": 0.3},
}


def run_startup(config: TargetsConfig, output_dir: pathlib.Path, log) -> dict:
    """{model: {choice: {"first_b_round_seconds", "first_a_round_seconds",
    "steady_round_seconds", "round_seconds", "driver_peak_mb", "worker_peak_mb", "final"},
    "steady_none_vs_tff"}} (module docstring), one entry per `config.startup_models`."""
    from tffl.runtime.graph_optimization import GRAPH_OPTIMIZATIONS

    unknown = [m for m in config.startup_models if m not in STARTUP_SETTINGS]
    if unknown or not config.startup_models:
        raise ValueError(f"startup_models={','.join(config.startup_models)}: unknown "
                         f"{', '.join(unknown) or '(none)'}; choose from "
                         f"{', '.join(STARTUP_SETTINGS)}")
    folders = {(model, choice): output_dir / f"startup_{model}_{choice}"
               for model in config.startup_models for choice in GRAPH_OPTIMIZATIONS}
    for folder in folders.values():   # before minutes of loading a model, not after
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds an earlier start-up run; give another --output_dir")
    return {model: _startup_of(model, config, folders, log) for model in config.startup_models}


def _startup_of(model: str, config: TargetsConfig, folders: dict, log) -> dict:
    from runner import run
    from runner.run_config import RunConfig
    from tffl.runtime.graph_optimization import GRAPH_OPTIMIZATIONS
    from tffl.simulation import driver, metrics_log

    results = {}
    for choice in GRAPH_OPTIMIZATIONS:
        folder = folders[model, choice]
        run_config = RunConfig().with_changes(
            **STARTUP_SETTINGS[model], data_dir=config.data_dir, algorithm=("rolora",),
            lora_targets=("query", "value"), num_clients=3, clients_per_round=3,
            rounds=STARTUP_ROUNDS, eval_every=STARTUP_ROUNDS, seed=config.seed,
            graph_optimization=choice, output_dir=str(folder))
        log(f"startup: RoLoRA on {model}, {STARTUP_ROUNDS} rounds, graph optimization "
            f"{choice!r} -> {folder}")
        (summary,) = run.run(run_config)
        rows = metrics_log.read_metrics(folder / driver.METRICS_FILE)
        seconds = [float(row["round_seconds"]) for row in rows]
        steady = seconds[2:]
        results[choice] = {
            "first_b_round_seconds": seconds[0], "first_a_round_seconds": seconds[1],
            "steady_round_seconds": sum(steady) / len(steady), "round_seconds": seconds,
            "driver_peak_mb": float(rows[-1]["peak_rss_mb"]),
            "worker_peak_mb": float(rows[-1]["worker_peak_rss_mb"]), "final": summary["final"]}
        log(f"startup {model} {choice}: first B round {seconds[0]:.1f} s, first A round "
            f"{seconds[1]:.1f} s, later rounds {results[choice]['steady_round_seconds']:.2f} s "
            f"(mean of {len(steady)})")
    results["steady_none_vs_tff"] = (results["none"]["steady_round_seconds"]
                                     / results["tff"]["steady_round_seconds"])
    return results
