"""`--suite=targets`'s baseline part (benchmarks/targets.py): this checkout's seconds per round
against another checkout's (`TargetsConfig.baseline_checkout`, e.g. a clone at the commit before
a change), measured in one benchmark run.

Each checkout runs its own `scripts/train.py` in a child process of this one, with this Python and
that checkout's code first on `PYTHONPATH`, the baseline first and then this checkout, nothing
else running between them. Both are given the same flags (ones train.py has had since
f321d8b): RoLoRA on Gemma 3 270M at `sst2_instruct`'s budget
(`benchmarks.startup.STARTUP_SETTINGS`: LoRA r = 8 on query and value of layers 14-17, 2 local
steps of batch 8), N = 3 clients, all of them every round, `STARTUP_ROUNDS` rounds, evaluated
only after the last, each with its own frozen-weights folder (deleted after the run: a float32
base's is 1 GB); every other choice is that
checkout's own default (a float32 base, its worker's concurrency). Round 1 (a B round) and
round 2 (an A round) each compile their round kind; rounds 3 on are steady. From each run's
`metrics.csv`:

    steady_c = mean(round_seconds[2:])         (c = this checkout, baseline)
    round_time_vs_baseline = steady_this / steady_baseline

with both runs' first B and A rounds and their driver and worker peaks beside it. The two runs
train the same rounds from the same seed, so their final metrics are reported too: a change
that moved them is not a change of speed alone.

    uv run python scripts/benchmark.py --suite=targets --targets_parts=baseline \\
        --baseline_checkout=../tffl_at_c0ffee --output_dir=DIR
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from benchmarks.config import TargetsConfig
from benchmarks.startup import STARTUP_ROUNDS, STARTUP_SETTINGS

BASELINE_MODEL = "gemma3_270m"
THIS_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
# A run's child process is stopped after this long (at f321d8b, a run took 12.5 minutes here:
# its two compiling rounds 225-247 s each).
RUN_TIMEOUT_SECONDS = 3600
# The final metrics reported beside the seconds (each run's last row).
FINAL_COLUMNS = ("train_loss", "eval_accuracy", "eval_likelihood_accuracy", "eval_loss")


def train_flags(data_dir: str, output_dir: pathlib.Path, seed: int) -> list[str]:
    """scripts/train.py's flags of the baseline part's run (the module docstring's setting).

    >>> train_flags("/data", pathlib.Path("/out"), 0)[:3]
    ['--task=sst2_instruct', '--backbone=gemma3_270m', '--rank=8']
    """
    settings = STARTUP_SETTINGS[BASELINE_MODEL]
    values = {**settings, "lora_layers": ",".join(map(str, settings["lora_layers"])),
              "algorithm": "rolora", "lora_targets": "query,value", "num_clients": 3,
              "clients_per_round": 3, "rounds": STARTUP_ROUNDS, "eval_every": STARTUP_ROUNDS,
              "seed": seed, "data_dir": data_dir, "output_dir": str(output_dir),
              "frozen_dir": str(output_dir / "frozen")}
    return [f"--{name}={value}" for name, value in values.items()]


def run_baseline(config: TargetsConfig, output_dir: pathlib.Path, log) -> dict:
    """{"baseline": run, "this": run, "round_time_vs_baseline"}, each run {"checkout",
    "commit", "first_b_round_seconds", "first_a_round_seconds", "steady_round_seconds",
    "round_seconds", "driver_peak_mb", "worker_peak_mb", "final"} (module docstring)."""
    checkouts = {"baseline": checkout_root(config.baseline_checkout), "this": THIS_CHECKOUT}
    folders = {name: output_dir / f"baseline_{name}" for name in checkouts}
    for folder in folders.values():   # before minutes of loading a model, not after
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds an earlier baseline run; give another --output_dir")
    results = {}
    for name, checkout in checkouts.items():
        log(f"baseline: RoLoRA on {BASELINE_MODEL}, {STARTUP_ROUNDS} rounds, {name} checkout "
            f"{checkout} -> {folders[name]}")
        results[name] = measure_checkout(checkout, folders[name], config)
        r = results[name]
        log(f"baseline {name} ({r['commit']}): first B round {r['first_b_round_seconds']:.1f} s, "
            f"first A round {r['first_a_round_seconds']:.1f} s, later rounds "
            f"{r['steady_round_seconds']:.2f} s; driver {r['driver_peak_mb']:.0f} MB, worker "
            f"{r['worker_peak_mb']:.0f} MB")
    results["round_time_vs_baseline"] = (results["this"]["steady_round_seconds"]
                                         / results["baseline"]["steady_round_seconds"])
    return results


def measure_checkout(checkout: pathlib.Path, folder: pathlib.Path, config: TargetsConfig) -> dict:
    """Runs `checkout`'s scripts/train.py with `train_flags` in a child process (this Python,
    `PYTHONPATH=checkout`, its output in `folder`/train.log), then deletes the run's frozen-weights
    folder; returns {"checkout", "commit"} and its `metrics.csv`'s figures (`run_baseline`'s)."""
    from tffl.simulation import driver

    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(checkout / "scripts" / "train.py"),
               *train_flags(str(pathlib.Path(config.data_dir).resolve()), folder, config.seed)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        with open(folder / "train.log", "w") as out:
            status = subprocess.run(command, cwd=checkout, env=env, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    timeout=RUN_TIMEOUT_SECONDS).returncode
    except subprocess.TimeoutExpired:
        status = f"no exit after {RUN_TIMEOUT_SECONDS} s (stopped)"
    finally:
        shutil.rmtree(folder / "frozen", ignore_errors=True)   # the run's copy of the base
    if status:   # an OSError: scripts/benchmark.py prints it as one line
        raise ChildProcessError(f"{checkout}'s train.py: status {status}; see "
                                f"{folder / 'train.log'}")
    return {"checkout": str(checkout), "commit": _commit(checkout),
            **_round_figures(folder / driver.METRICS_FILE)}


def _round_figures(metrics_file: pathlib.Path) -> dict:
    """A run's seconds, peaks and final metrics from its `metrics.csv` (module docstring)."""
    from tffl.simulation import metrics_log

    rows = metrics_log.read_metrics(metrics_file)
    if len(rows) != STARTUP_ROUNDS:
        raise ValueError(f"{metrics_file} has {len(rows)} rounds, not {STARTUP_ROUNDS}; see "
                         "train.log beside it")
    seconds = [float(row["round_seconds"]) for row in rows]
    steady = seconds[2:]
    return {"first_b_round_seconds": seconds[0], "first_a_round_seconds": seconds[1],
            "steady_round_seconds": sum(steady) / len(steady), "round_seconds": seconds,
            "driver_peak_mb": max(float(row["peak_rss_mb"]) for row in rows),
            "worker_peak_mb": max(float(row["worker_peak_rss_mb"]) for row in rows),
            "final": {k: float(rows[-1][k]) for k in FINAL_COLUMNS if k in rows[-1]}}


def checkout_root(path: str) -> pathlib.Path:
    """The baseline checkout's root, checked to hold a scripts/train.py and not to be this one."""
    if not path:
        raise ValueError("the baseline part needs --baseline_checkout: a clone at the commit to "
                         "compare with (git clone . ../base && git -C ../base checkout COMMIT)")
    root = pathlib.Path(path).resolve()
    if not (root / "scripts" / "train.py").is_file():
        raise ValueError(f"baseline_checkout={path}: no scripts/train.py there; give a clone of "
                         "this repository")
    if root == THIS_CHECKOUT:
        raise ValueError(f"baseline_checkout={path} is this checkout; give a clone at the commit "
                         "to compare with (git clone . ../base && git -C ../base checkout COMMIT)")
    return root


def _commit(checkout: pathlib.Path) -> str:
    """The checkout's commit (short hash), or "unknown" outside git."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"
