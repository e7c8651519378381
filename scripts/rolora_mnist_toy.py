r"""RoLoRA's MNIST toy (rolora.md §2.5): RoLoRA vs FedAvg-LoRA vs FFA-LoRA, best learning rate each.

Model logits = ReLU(x·A·B)·W_out with A (784×16), B (16×784) trained and W_out fixed; MNIST-5k
(../shared/data/mnist, 4,000 train / 1,000 test) split with no overlap into 5 clients × 2 labels
and 10 clients × 1 label, every client every round, ~5 local epochs per round (60 steps of 64).
As in the paper, several learning rates are tried and the best final test accuracy of each method
is reported. Each (setting, learning rate) is one `scripts/train.py` run in
`<output_dir>/toy_<N>x<k>_lr<lr>/`; a run that is already complete there is reused (--resume), so
the script can be stopped and rerun.

    uv run python scripts/rolora_mnist_toy.py --output_dir=runs/rolora_mnist_toy

Writes `results.md` and `results.csv` to --output_dir and prints the table.
"""

from __future__ import annotations

import csv
import json
import pathlib
import subprocess
import sys

from absl import app
from absl import flags

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/rolora_mnist_toy", "Where runs and tables go.")
_LEARNING_RATES = flags.DEFINE_list("learning_rates", "0.5,0.1,0.05", "Client learning rates tried.")
_SETTINGS = flags.DEFINE_list("settings", "5x2,10x1", "Settings NxK: N clients with K labels each.")
_ROUNDS = flags.DEFINE_integer("rounds", 60, "Communication rounds.")
_LOCAL_STEPS = flags.DEFINE_integer("local_steps", 60, "Local steps (batch 64) per round.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Folder with mnist/mnist_5k.csv.gz (the paper toy's MNIST-5k, e.g. "
    "../shared/data); default: train.py's, MNIST through TFDS.")

ALGORITHMS = ("rolora", "fedavg_lora", "ffa_lora")
TRAIN = pathlib.Path(__file__).resolve().parent / "train.py"
PAPER_CLAIMS = (
    "Paper (rolora.md §2.5, Figure 2; curves only, no numbers): FFA-LoRA plateaus around 55% in "
    "both settings; FedAvg-LoRA degrades as the number of clients grows (inexact aggregation); "
    "RoLoRA is the most robust."
)


def _parse_setting(text: str) -> tuple[int, int]:
    try:
        n, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise app.UsageError(f"flag --settings: {text!r} is not NxK (e.g. 5x2)") from None
    if n < 1 or not 1 <= k <= 10:
        raise app.UsageError(f"flag --settings: {text!r} needs N >= 1 and 1 <= K <= 10")
    return n, k


def run_setting(n: int, k: int, lr: str, root: pathlib.Path) -> list[dict]:
    """Runs (or reuses) the three algorithms for one setting and learning rate."""
    run_dir = root / f"toy_{n}x{k}_lr{lr}"
    args = [
        sys.executable, str(TRAIN), "--task=mnist", f"--algorithm={','.join(ALGORITHMS)}",
        f"--num_clients={n}", f"--clients_per_round={n}", f"--classes_per_client={k}",
        "--rank=16", "--batch_size=64", f"--local_steps={_LOCAL_STEPS.value}",
        f"--rounds={_ROUNDS.value}", "--eval_every=10", f"--learning_rate={lr}",
        f"--output_dir={run_dir}",
    ]
    if _DATA_DIR.value:
        args.append(f"--data_dir={_DATA_DIR.value}")
    if all((run_dir / a / "summary.json").exists() for a in ALGORITHMS):
        args.append("--resume")  # complete: train.py reloads the last checkpoint and stops
    print(f"== {n} clients x {k} labels, learning rate {lr} -> {run_dir}", flush=True)
    proc = subprocess.run(args)
    if proc.returncode != 0:
        raise SystemExit(f"rolora_mnist_toy.py: error: train.py failed for {run_dir}")
    return [json.loads((run_dir / a / "summary.json").read_text()) for a in ALGORITHMS]


def main(argv: list[str]) -> None:
    del argv
    root = pathlib.Path(_OUTPUT_DIR.value)
    root.mkdir(parents=True, exist_ok=True)
    settings = [_parse_setting(s) for s in _SETTINGS.value]
    rows = []
    for n, k in settings:
        for lr in _LEARNING_RATES.value:
            for summary in run_setting(n, k, lr, root):
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
    for n, k in settings:
        setting = f"{n} clients x {k} labels"
        for algorithm in ALGORITHMS:
            mine = [r for r in rows if r["setting"] == setting and r["algorithm"] == algorithm]
            best = max(mine, key=lambda r: r["final_test_accuracy"])
            lines.append(
                f"| {setting} | {algorithm} | {best['learning_rate']:g} | "
                f"{best['final_test_accuracy']:.4f} | {best['best_test_accuracy']:.4f} |"
            )
    table = "\n".join(lines)
    command = (f"uv run python scripts/rolora_mnist_toy.py --rounds={_ROUNDS.value} "
               f"--local_steps={_LOCAL_STEPS.value} "
               f"--learning_rates={','.join(_LEARNING_RATES.value)} "
               f"--settings={','.join(_SETTINGS.value)}")
    (root / "results.md").write_text(
        f"{command}\n\n{table}\n\nLearning rates tried: {', '.join(_LEARNING_RATES.value)}; "
        f"the best final test accuracy per method is shown.\n\n{PAPER_CLAIMS}\n"
    )
    print("\n" + table + "\n\n" + PAPER_CLAIMS)


if __name__ == "__main__":
    app.run(main)
