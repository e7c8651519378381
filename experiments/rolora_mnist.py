"""Experiment 2, `rolora_mnist`: RoLoRA's MNIST toy (rolora.md §2.5).

`run_toy(root, ToySweep(...))` runs RoLoRA, FedAvg-LoRA and FFA-LoRA for each setting (N
clients × K labels) and learning rate of the sweep, one training run
(`runner.running.run_training`) per (setting, learning rate) in
`<root>/toy_<N>x<K>_lr<lr>/`, and writes `results.csv` and `results.md` (the best final test
accuracy per method). `scripts/rolora_mnist_toy.py` is its command line; `run_rolora_mnist` is
`scripts/reproduce.py --experiment=rolora_mnist`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pathlib
import shutil
from collections.abc import Callable

from runner.report import Column, Panel, Series, Table, as_float, read_csv
from runner.run_config import RunConfig
from runner.running import METHOD_NAMES, Context, Result, eval_curve, need_data, run_training

TOY_ALGORITHMS = ("rolora", "fedavg_lora", "ffa_lora")
TOY_PAPER_CLAIMS = (
    "Paper (rolora.md §2.5, Figure 2; curves only, no numbers): FFA-LoRA plateaus around 55% in "
    "both settings; FedAvg-LoRA degrades as the number of clients grows (inexact aggregation); "
    "RoLoRA is the most robust."
)


def parse_setting(text: str) -> tuple[int, int]:
    """`"5x2"` -> (5 clients, 2 labels each); raises `ValueError` naming the text.

    >>> parse_setting("10x1")
    (10, 1)
    """
    try:
        n, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"flag --settings: {text!r} is not NxK (e.g. 5x2)") from None
    if n < 1 or not 1 <= k <= 10:
        raise ValueError(f"flag --settings: {text!r} needs N >= 1 and 1 <= K <= 10")
    return n, k


@dataclasses.dataclass(frozen=True)
class ToySweep:
    """The toy runs' grid and schedule (`scripts/rolora_mnist_toy.py`'s flags of the same names).

    Attributes:
      settings: "NxK" texts (N clients × K labels each, `parse_setting`).
      learning_rates: the client learning rates tried, as texts (they name the run folders).
      rounds: communication rounds of every run.
      local_steps: local SGD steps per communication round.
      data_dir: the MNIST-5k folder (None: the default).
    """

    settings: tuple[str, ...]
    learning_rates: tuple[str, ...]
    rounds: int
    local_steps: int
    data_dir: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "settings", tuple(self.settings))
        object.__setattr__(self, "learning_rates", tuple(self.learning_rates))


def toy_config(n: int, k: int, lr: str, run_dir: pathlib.Path, sweep: ToySweep) -> RunConfig:
    """The training run of one setting (N clients × K labels) and learning rate of `sweep`: the
    three algorithms on MNIST, all clients every round, rank 16, batch 64."""
    config = RunConfig().with_changes(
        task="mnist", algorithm=TOY_ALGORITHMS, num_clients=n, clients_per_round=n,
        classes_per_client=k, rank=16, batch_size=64, local_steps=sweep.local_steps,
        rounds=sweep.rounds, eval_every=10, learning_rate=float(lr), output_dir=str(run_dir))
    return config.with_changes(data_dir=sweep.data_dir) if sweep.data_dir else config


def _toy_run(n: int, k: int, lr: str, root: pathlib.Path, sweep: ToySweep, resume: bool,
             log: Callable[[str], None], isolate: bool = False) -> list[dict]:
    """One setting and learning rate: a training run of the three algorithms (reused when
    complete; with `resume`, a run stopped mid-way is rerun from scratch)."""
    run_dir = root / f"toy_{n}x{k}_lr{lr}"
    complete = all((run_dir / a / "summary.json").exists() for a in TOY_ALGORITHMS)
    if run_dir.exists() and not complete and resume:
        log(f"resume: {run_dir.name} was stopped mid-way; rerunning it")
        shutil.rmtree(run_dir)
    # A complete run is resumed: it reloads the last checkpoint and stops.
    config = toy_config(n, k, lr, run_dir, sweep).with_changes(resume=complete)
    log(f"== {n} clients x {k} labels, learning rate {lr} -> {run_dir}")
    run_training(config, f"training ({n}x{k}, lr {lr})", isolate)
    return [json.loads((run_dir / a / "summary.json").read_text()) for a in TOY_ALGORITHMS]


def run_toy(root: pathlib.Path, sweep: ToySweep, resume: bool = True,
            log: Callable[[str], None] = print, isolate: bool = False) -> str:
    """Runs every setting × learning rate of `sweep` (`isolate`: each run in a child process);
    writes `results.csv` and `results.md` to `root` and returns the table (the best final test
    accuracy of each method over the learning rates)."""
    settings, learning_rates = sweep.settings, sweep.learning_rates
    parsed = [parse_setting(s) for s in settings]
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, k in parsed:
        for lr in learning_rates:
            for summary in _toy_run(n, k, lr, root, sweep, resume, log, isolate):
                final = summary["final"]
                rows.append({
                    "setting": f"{n} clients x {k} labels",
                    "algorithm": summary["algorithm"],
                    "learning_rate": float(lr),
                    "final_test_accuracy": final.get("eval_accuracy", float("nan")),
                    "best_test_accuracy": summary["best_eval_accuracy"],
                    "final_train_loss": final.get("train_loss", float("nan")),
                })
    with open(root / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "| setting | algorithm | best learning rate | final test accuracy | best test accuracy "
        "(any evaluated round) |",
        "|---|---|---|---|---|",
    ]
    for n, k in parsed:
        setting = f"{n} clients x {k} labels"
        for algorithm in TOY_ALGORITHMS:
            mine = [r for r in rows if r["setting"] == setting and r["algorithm"] == algorithm]
            best = max(mine, key=lambda r: r["final_test_accuracy"])
            lines.append(
                f"| {setting} | {algorithm} | {best['learning_rate']:g} | "
                f"{best['final_test_accuracy']:.4f} | {best['best_test_accuracy']:.4f} |"
            )
    table = "\n".join(lines)
    command = (f"uv run python scripts/rolora_mnist_toy.py --rounds={sweep.rounds} "
               f"--local_steps={sweep.local_steps} --learning_rates={','.join(learning_rates)} "
               f"--settings={','.join(settings)}")
    (root / "results.md").write_text(
        f"{command}\n\n{table}\n\nLearning rates tried: {', '.join(learning_rates)}; "
        f"the best final test accuracy per method is shown.\n\n{TOY_PAPER_CLAIMS}\n"
    )
    return table


# ------------------------------------------------------------------------------------------------
# 2. rolora_mnist


MNIST_SCALES = {
    "small": dict(rounds=20, local_steps=20, learning_rates=("0.5", "0.1")),
    "full": dict(rounds=60, local_steps=60, learning_rates=("0.5", "0.1", "0.05")),
}
MNIST_SETTINGS = ("5x2", "10x1")
# docs/RESULTS.md (the full-scale setting: 60 rounds x 60 steps, learning rates 0.5, 0.1, 0.05).
MNIST_RECORDED = {
    ("5 clients x 2 labels", "rolora"): 0.8770,
    ("5 clients x 2 labels", "fedavg_lora"): 0.7560,
    ("5 clients x 2 labels", "ffa_lora"): 0.5820,
    ("10 clients x 1 labels", "rolora"): 0.7990,
    ("10 clients x 1 labels", "fedavg_lora"): 0.6420,
    ("10 clients x 1 labels", "ffa_lora"): 0.5580,
}
MNIST_PAPER = {"rolora": "most robust", "fedavg_lora": "degrades as clients grow",
               "ffa_lora": "plateaus ≈ 55%"}


def run_rolora_mnist(ctx: Context) -> Result:
    need_data(ctx, "mnist/mnist_5k.csv.gz")
    cfg = MNIST_SCALES[ctx.scale]
    toy_dir = ctx.output_dir / "toy"
    run_toy(toy_dir, ToySweep(MNIST_SETTINGS, cfg["learning_rates"], cfg["rounds"],
                              cfg["local_steps"], str(ctx.data_dir)),
            resume=ctx.resume, log=ctx.log, isolate=ctx.isolate)
    results = read_csv(toy_dir / "results.csv")
    rows, panels = [], []
    for setting_flag in MNIST_SETTINGS:
        n, k = setting_flag.split("x")
        setting = f"{n} clients x {k} labels"
        series = []
        for algorithm in TOY_ALGORITHMS:
            mine = [r for r in results if r["setting"] == setting and r["algorithm"] == algorithm]
            best = max(mine, key=lambda r: as_float(r["final_test_accuracy"]))
            lr = f"{as_float(best['learning_rate']):g}"
            run_dir = toy_dir / f"toy_{n}x{k}_lr{_lr_text(best['learning_rate'], cfg)}" / algorithm
            summary = json.loads((run_dir / "summary.json").read_text())
            comm = max(1, summary["communication_rounds"])
            rows.append({
                "setting": setting, "algorithm": METHOD_NAMES[algorithm],
                "best_learning_rate": lr,
                "communication_rounds": summary["communication_rounds"],
                "final_test_accuracy": as_float(best["final_test_accuracy"]),
                "best_test_accuracy": as_float(best["best_test_accuracy"]),
                "upload_kib": summary["upload_bytes_per_client_total"] / comm / 1024,
                "recorded_full": MNIST_RECORDED.get((setting, algorithm)),
                "paper": MNIST_PAPER[algorithm],
            })
            x, y = eval_curve(run_dir / "metrics.csv")
            series.append(Series(f"{METHOD_NAMES[algorithm]} (lr {lr})", x, y))
        panels.append(Panel(f"MNIST-5k, {setting}", "communication round", "test accuracy",
                            series, hlines=[("paper: FFA-LoRA plateau ≈ 55%", 0.55)]))
    columns = [
        Column("setting", "setting"), Column("algorithm", "algorithm"),
        Column("best learning rate", "best_learning_rate"),
        Column("comm. rounds", "communication_rounds"),
        Column("final test accuracy", "final_test_accuracy", "{:.4f}"),
        Column("best test accuracy", "best_test_accuracy", "{:.4f}"),
        Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
        Column("docs/RESULTS.md (full scale, final)", "recorded_full", "{:.4f}"),
        Column("paper (Figure 2, curves only)", "paper"),
    ]
    title = (
        f"RoLoRA MNIST toy (rolora.md §2.5): logits = ReLU(x·A·B)·W_out, A 784×16, B 16×784, "
        f"W_out fixed; MNIST-5k (4,000 train / 1,000 test), clients with disjoint labels, all "
        f"clients every round, {cfg['rounds']} communication rounds of {cfg['local_steps']} local "
        f"SGD steps of batch 64; per method the best final test accuracy over learning rates "
        f"{', '.join(cfg['learning_rates'])} (scripts/rolora_mnist_toy.py).")
    notes = ["Paper (rolora.md §2.5, Figure 2; curves only, no numbers): FFA-LoRA plateaus "
             "around 55% in both settings; FedAvg-LoRA degrades as the number of clients grows "
             "(inexact aggregation); RoLoRA is the most robust."]
    return Result(Table(title, columns, rows, notes), panels, "RoLoRA MNIST toy")


def _lr_text(value: str, cfg: dict) -> str:
    """The learning-rate text the toy script used in its folder name for `value`."""
    for text in cfg["learning_rates"]:
        if math.isclose(float(text), float(value)):
            return text
    return value
