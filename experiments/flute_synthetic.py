"""Linear FLUTE against FedRep on FLUTE's under-parameterized synthetic task (App. C.1, Figure 3).

The library side of `scripts/flute_synthetic.py`, whose docstring gives the task, the methods and
the error: `run_setting(M, k, seed, config)` runs every method on one problem (in a TFF runtime
the caller opens) and returns one row per method and step size; `write_results` writes
`results.csv` and `results.md` (mean ± std over seeds). A config is `DEFAULTS` with changes and
its "output_dir".
"""

from __future__ import annotations

import collections
import csv
import pathlib
import time

import numpy as np

from runner import cli


METHODS = ("flute", "fedrep_ri", "fedrep_mom")
# The settings of `scripts/flute_synthetic.py`'s flags by default (their one place): lists are
# the grid (M, k, seeds), the rest one value each.
DEFAULTS = dict(ks=[2, 4], num_clients=[30], num_samples=20, dim=10, noise_variance=0.3,
                learning_rate=0.03, gamma1=0.25, gamma2=0.125,
                fedrep_learning_rates=[0.03, 0.3], methods=list(METHODS), rounds=200,
                report_rounds=[25, 50, 100], seeds=[0, 1])
PAPER_TREND = (
    "Paper (flute.md §5.3; Figures 1 and 3 are curves, no numbers): FLUTE beats FedRep(RI) in far "
    "fewer iterations; with d, M, N fixed, increasing k shrinks the gap in convergence speed "
    "between FLUTE and FedRep; with d, k, N fixed, increasing M lowers FLUTE's average error."
)


def _data(problem) -> list[collections.OrderedDict]:
    return [collections.OrderedDict(x=x.astype(np.float32), y=y.astype(np.float32))
            for x, y in zip(problem.features, problem.targets)]


def _mean_error(thetas: np.ndarray, phi: np.ndarray) -> float:
    """(1/M) Σ_i ‖θ_i − φ_i‖ for thetas (M×d) and phi (d×M)."""
    return float(np.mean(np.linalg.norm(thetas - phi.T, axis=1)))


def _fedrep_predictors(b: np.ndarray, problem) -> np.ndarray:
    """B w_i with w_i = argmin ‖X_i B w − y_i‖ (FedRep's exact heads), M×d."""
    b = np.asarray(b, np.float64)
    heads = [np.linalg.lstsq(x @ b, y, rcond=None)[0]
             for x, y in zip(problem.features, problem.targets)]
    return np.stack(heads) @ b.T


def _run(process, data: list, label: str, checkpoints: list[int], error_fn,
         run_dir: pathlib.Path | None, diverged: str | None = None,
         initial_state=None) -> dict[int, float]:
    """`checkpoints[-1]` rounds of `process` (all clients, each on its fixed data, every round;
    `checkpoints` ascending) with `tffl.simulation.driver.run_rounds` in `run_dir`; the error at
    every checkpoint round, with progress lines. `error_fn(state, personal states in client order or None)`; `diverged`: the message of
    the FloatingPointError raised at the first round whose loss is not finite (None: no check);
    `initial_state`: where round 1 starts (default `process.initialize()`)."""
    from tffl.simulation import participation
    from tffl.simulation import driver

    rounds = checkpoints[-1]
    ids = [f"client_{i:03d}" for i in range(len(data))]
    by_id, started = dict(zip(ids, data)), time.perf_counter()

    def evaluate(state, store=None):  # the state after round `round_num`
        if process.round_num(state) not in checkpoints:
            return {}
        return {"error": error_fn(state, None if store is None else store.lookup(ids))}

    def after_round(row, _) -> None:  # every round's metrics row
        if diverged is not None and not np.isfinite(row["train_loss"]):
            raise FloatingPointError(diverged)
        if "eval_error" in row:
            print(f"  {label}: round {row['round']}/{rounds}, error {row['eval_error']:.4f} "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)

    with cli.run_directory(run_dir, prefix="flute_synthetic_") as output_dir:
        result = driver.run_rounds(
            process, participation.FullParticipation(ids), lambda cid, _: by_id[cid], rounds,
            output_dir,
            driver.RunOptions(
                evaluate_fn=evaluate, eval_every=1, checkpoint_every=rounds, log=None,
                tensorboard=False, after_round=after_round, initial_state=initial_state))
    return {row["round"]: row["eval_error"] for row in result.history if "eval_error" in row}


def run_setting(num_clients: int, k: int, seed: int, config: dict) -> list[dict]:
    """All methods on one (M, k, seed); one result row per run. Inside `local_runtime()`. Each run
    goes to `<config["output_dir"]>/M<M>_k<k>_seed<seed>/<method>_eta<η>/` (a temporary directory
    if `config` has no output_dir)."""
    from tasks import synthetic
    from tffl.algorithms import fedrep_linear
    from tffl.engine import linear_engine
    from tffl.algorithms import flute_linear

    problem = synthetic.flute_linear(num_clients, config["num_samples"], config["dim"],
                                     noise_std=float(np.sqrt(config["noise_variance"])), seed=seed)
    data = _data(problem)
    floor = _mean_error(problem.optimal_predictors(k).T, problem.phi)
    checkpoints = config["report_rounds"] + [config["rounds"]]
    base = dict(num_clients=num_clients, k=k, seed=seed, floor=floor)
    rows = []
    flute = flute_linear.build_flute_linear(config["dim"], k, config["learning_rate"],
                                            gamma1=config["gamma1"], gamma2=config["gamma2"],
                                            seed=seed)
    flute_b0 = linear_engine.get_representation(flute.initialize())
    tag = f"[M={num_clients} k={k} seed={seed}]"
    print(f"{tag} rank-k optimum (floor) {floor:.4f}", flush=True)
    root = config.get("output_dir")
    setting_dir = None if root is None else pathlib.Path(root) / f"M{num_clients}_k{k}_seed{seed}"

    def run_dir(method: str, eta: float) -> pathlib.Path | None:
        return None if setting_dir is None else setting_dir / f"{method}_eta{eta:g}"

    if "flute" in config["methods"]:
        errors = _run(
            flute, data, f"{tag} flute η={config['learning_rate']:g}", checkpoints,
            lambda state, personal: _mean_error(flute_linear.predictors(state, personal),
                                                problem.phi),
            run_dir("flute", config["learning_rate"]),
            diverged=f"FLUTE diverged (M={num_clients}, k={k}, seed={seed}); lower --learning_rate")
        rows.append(base | dict(method="flute", learning_rate=config["learning_rate"],
                                errors=errors))

    for init in ("ri", "mom"):
        if f"fedrep_{init}" not in config['methods']:
            continue
        rates = config["fedrep_learning_rates"] if init == "ri" else \
            config["fedrep_learning_rates"][:1]
        for eta in rates:
            fedrep = fedrep_linear.build_fedrep_linear(config["dim"], k, eta, seed=seed)
            if init == "ri":
                state = linear_engine.set_representation(fedrep, fedrep.initialize(), flute_b0)
            else:
                state = fedrep_linear.initialize_by_moments(fedrep, data)
            errors = _run(
                fedrep, data, f"{tag} fedrep_{init} η={eta:g}", checkpoints,
                lambda state, _: _mean_error(_fedrep_predictors(
                    linear_engine.get_representation(state), problem), problem.phi),
                run_dir(f"fedrep_{init}", eta), initial_state=state)
            rows.append(base | dict(method=f"fedrep_{init}", learning_rate=eta, errors=errors))
    return rows


_NAMES = {"flute": "FLUTE", "fedrep_ri": "FedRep(RI)", "fedrep_mom": "FedRep (MoM init)"}


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def write_results(rows: list[dict], config: dict) -> str:
    """results.csv (every run) and results.md (mean ± std over seeds); returns the markdown."""
    output_dir = config["output_dir"]
    checkpoints = config["report_rounds"] + [config["rounds"]]
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["num_clients", "k", "seed", "method", "learning_rate", "floor"]
                        + [f"error_round_{t}" for t in checkpoints])
        for r in rows:
            writer.writerow([r["num_clients"], r["k"], r["seed"], r["method"], r["learning_rate"],
                             f"{r['floor']:.6f}"] + [f"{r['errors'][t]:.6f}" for t in checkpoints])
    seeds = config["seeds"]
    header = (["M", "k", "method", "η"] + [f"round {t}" for t in config['report_rounds']]
              + [f"final (round {config['rounds']})"])
    lines = [
        f"FLUTE vs FedRep, error (1/M) Σ_i ‖B w_i − φ_i‖ (mean ± std over seeds "
        f"{','.join(map(str, seeds))}); d={config['dim']}, N={config['num_samples']} samples per "
        f"client, noise variance {config['noise_variance']:g}, FLUTE γ1={config['gamma1']:g}, "
        f"γ2={config['gamma2']:g}, η_l=η_r={config['learning_rate']:g}, init α=1/(10d); all "
        "clients every round.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for m in config["num_clients"]:
        for k in config["ks"]:
            group = [r for r in rows if r["num_clients"] == m and r["k"] == k]
            floors = [r["floor"] for r in group if r["method"] == group[0]["method"]]
            keys = list(dict.fromkeys((r["method"], r["learning_rate"]) for r in group))
            for method, eta in keys:
                runs = [r for r in group if (r["method"], r["learning_rate"]) == (method, eta)]
                cells = [_mean_std([r["errors"][t] for r in runs]) for t in checkpoints]
                lines.append(f"| {m} | {k} | {_NAMES[method]} | {eta:g} | " + " | ".join(cells)
                             + " |")
            lines.append(f"| {m} | {k} | rank-k optimum (noise-free floor) | – | "
                         + " | ".join("–" for _ in config["report_rounds"])
                         + (" | " if config["report_rounds"] else "")
                         + _mean_std(floors) + " |")
    lines += ["", PAPER_TREND]
    text = "\n".join(lines)
    (output_dir / "results.md").write_text(text + "\n")
    return text
