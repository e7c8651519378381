"""`--suite=targets`'s start-up part (benchmarks/targets.py): how soon each round kind of a
Gemma 3 270M RoLoRA run trains, and its later rounds' seconds, with TFF's Grappler pass over the
graphs and without it (`tffl.runtime.graph_optimization`).

For each choice of `GRAPH_OPTIMIZATIONS`, in this process one after the other, `runner.run.run`
(what scripts/train.py runs) trains `sst2_instruct`'s RoLoRA at N = 3 with its budget (LoRA r = 8
on query and value of layers 14-17, 2 local steps of batch 8 per client, all clients every round)
for `STARTUP_ROUNDS` communication rounds, evaluating only after the last. Round 1 (a B round)
and round 2 (an A round) each compile their round kind on first use: their `round_seconds` are
that kind's start-up plus one round. Rounds 3 on are steady. Reported per choice: those two
rounds' seconds, the steady rounds' mean, the driver's and the worker's peak resident memory
(`tffl.simulation.memory`), and the final metrics (the same rounds either way);
`startup_steady_none_vs_tff` is the steady mean without the pass over the mean with it.
"""

from __future__ import annotations

import pathlib

from benchmarks.config import TargetsConfig

STARTUP_ROUNDS = 8


def run_startup(config: TargetsConfig, output_dir: pathlib.Path, log) -> dict:
    """{choice: {"first_b_round_seconds", "first_a_round_seconds", "steady_round_seconds",
    "round_seconds", "driver_peak_mb", "worker_peak_mb", "final"}, "steady_none_vs_tff"}
    (module docstring)."""
    from runner import run
    from runner.run_config import RunConfig
    from tffl.runtime.graph_optimization import GRAPH_OPTIMIZATIONS
    from tffl.simulation import driver, metrics_log

    folders = {choice: output_dir / f"startup_{choice}" for choice in GRAPH_OPTIMIZATIONS}
    for folder in folders.values():   # before minutes of loading Gemma, not after
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds an earlier start-up run; give another --output_dir")
    results = {}
    for choice, folder in folders.items():
        run_config = RunConfig().with_changes(
            task="sst2_instruct", backbone="gemma3_270m", data_dir=config.data_dir,
            algorithm=("rolora",), rank=8, lora_targets=("query", "value"),
            lora_layers=(14, 15, 16, 17), num_clients=3, clients_per_round=3,
            rounds=STARTUP_ROUNDS, local_steps=2, batch_size=8, learning_rate=0.1,
            eval_every=STARTUP_ROUNDS, seed=config.seed, graph_optimization=choice,
            output_dir=str(folder))
        log(f"startup: RoLoRA on Gemma 3 270M, {STARTUP_ROUNDS} rounds, graph optimization "
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
        log(f"startup {choice}: first B round {seconds[0]:.1f} s, first A round "
            f"{seconds[1]:.1f} s, later rounds {results[choice]['steady_round_seconds']:.2f} s "
            f"(mean of {len(steady)})")
    results["steady_none_vs_tff"] = (results["none"]["steady_round_seconds"]
                                     / results["tff"]["steady_round_seconds"])
    return results
