"""AdaptPFL (variants a and b) against FedRep and local training on the linear synthetic task.

The library side of `scripts/adaptpfl_synthetic.py`, whose docstring gives the task, the methods
and the error: `run_setting(m, seed, config)` runs every method on one problem (in a TFF runtime
the caller opens) and returns one row per method; `write_results` writes `results.csv` and
`results.md` (mean ± std over seeds). `config` holds the script's flag values by flag name.
"""

from __future__ import annotations

import collections
import csv
import pathlib
import time

import numpy as np

from runner import cli


METHODS = ("fedrep", "fedrep_gd", "adaptpfl", "local")
# The settings of `scripts/adaptpfl_synthetic.py`'s flags by default (their one place): lists are
# the grid (m, AdaptPFL's α, seeds), the rest one value each.
DEFAULTS = dict(num_clients=50, num_samples=[20, 40], dim=20, rank=2, data_alpha=0.3,
                shortcut_norm=1.0, orthogonal_to_heads=False, noise_std=0.1, alphas=[0.3, 0.5],
                learning_rate=0.1, head_steps=10, shortcut_steps=10, representation_steps=1,
                shortcut_ridge=0.0, adaptpfl_variant="a", project_shortcut=True,
                shortcut_damping=1.0, head_damping=1.0, adaptpfl_order="sw", init="moments",
                methods=list(METHODS), rounds=100, seeds=[0, 1])


def _mean_error(thetas: np.ndarray, problem) -> float:
    return float(np.mean(np.linalg.norm(thetas - problem.thetas, axis=1)))


def _run(process, data: list, label: str, rounds: int, evaluate, run_dir: pathlib.Path | None,
         diverged: str | None = None, initial_state=None) -> dict:
    """`rounds` rounds of `process` (all clients, each on its fixed data, every round) with
    `tffl.simulation.driver.run_rounds` in `run_dir`, the loss printed every tenth round; returns the last
    round's metrics row, whose eval_* are `evaluate(state, personal states in client order or
    None)` after the last round. `diverged`: the message of the FloatingPointError raised at the
    first round whose loss is not finite (None: no check); `initial_state`: where round 1 starts
    (default `process.initialize()`)."""
    from tffl.simulation import participation
    from tffl.simulation import driver

    ids = [f"client_{i:03d}" for i in range(len(data))]
    by_id = dict(zip(ids, data))

    def after_round(row, _) -> None:  # every round's metrics row
        t, loss = row["round"], row["train_loss"]
        if diverged is not None and not np.isfinite(loss):
            raise FloatingPointError(diverged)
        if t % max(1, rounds // 10) == 0 or t == rounds:
            print(f"  {label}: round {t}/{rounds}, loss {loss:.4f}", flush=True)

    with cli.run_directory(run_dir, prefix="adaptpfl_synthetic_") as output_dir:
        result = driver.run_rounds(
            process, participation.FullParticipation(ids), lambda cid, _: by_id[cid], rounds,
            output_dir, driver.RunOptions(
                evaluate_fn=lambda state, store=None: evaluate(
                    state, None if store is None else store.lookup(ids)),
                checkpoint_every=rounds, log=None, tensorboard=False, after_round=after_round,
                initial_state=initial_state))
    return result.history[-1]


def run_setting(num_samples: int, seed: int, config: dict) -> list[dict]:
    """All methods on one (m, seed); one result row per method. Inside `local_runtime()`. Each
    federated run goes to `<config["output_dir"]>/m<m>_seed<seed>/<method>[_alpha<α>]/` (a
    temporary directory if `config` has no output_dir)."""
    from tasks import subspace
    from tasks import synthetic
    from tffl.algorithms import adaptpfl_linear
    from tffl.engine import linear_engine
    from tffl.algorithms import fedrep_linear

    d, k, eta = config["dim"], config["rank"], config["learning_rate"]
    problem = synthetic.adaptpfl_linear(
        config["num_clients"], num_samples, d, k, shortcuts=synthetic.ShortcutTruth(
            alpha=config["data_alpha"], shortcut_norm=config["shortcut_norm"],
            orthogonal_to_heads=config["orthogonal_to_heads"]),
        noise_std=config["noise_std"], seed=seed)
    data = [collections.OrderedDict(x=x.astype(np.float32), y=y.astype(np.float32))
            for x, y in zip(problem.features, problem.targets)]
    fedrep = fedrep_linear.build_fedrep_linear(d, k, eta, seed=seed)
    state = (fedrep_linear.initialize_by_moments(fedrep, data) if config["init"] == "moments"
             else fedrep.initialize())
    b0 = linear_engine.get_representation(state)
    tag = f"[m={num_samples} seed={seed}]"
    base = dict(num_samples=num_samples, seed=seed)
    rows = []
    root = config.get("output_dir")
    setting_dir = None if root is None else pathlib.Path(root) / f"m{num_samples}_seed{seed}"

    def run_dir(name: str) -> pathlib.Path | None:
        return None if setting_dir is None else setting_dir / name

    def evaluation(thetas, b) -> dict:
        return dict(error=_mean_error(thetas, problem),
                    dist=subspace.principal_angle_distance(b, problem.b_star))

    def record(method, alpha, error, dist, started):
        row = base | dict(method=method, alpha=alpha, error=error, dist=dist)
        rows.append(row)
        print(f"  {tag} {method}{'' if alpha is None else f' α={alpha:g}'}: personalized error "
              f"{row['error']:.4f}, dist(B, B*) {row['dist']:.4f} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)

    if "fedrep" in config["methods"]:
        started = time.perf_counter()

        def fedrep_evaluation(state, _):  # the exact heads for the final B
            b = linear_engine.get_representation(state).astype(np.float64)
            heads = np.stack([np.linalg.lstsq(x @ b, y, rcond=None)[0]
                              for x, y in zip(problem.features, problem.targets)])
            return evaluation(heads @ b.T, b)

        last = _run(fedrep, data, f"{tag} fedrep", config["rounds"], fedrep_evaluation,
                    run_dir("fedrep"), initial_state=state)
        record("fedrep", None, last["eval_error"], last["eval_dist"], started)

    runs = ([("fedrep_gd", 0.0)] if "fedrep_gd" in config["methods"] else []) + (
        [("adaptpfl", a) for a in config["alphas"]] if "adaptpfl" in config["methods"] else [])
    for method, alpha in runs:
        started = time.perf_counter()
        process = adaptpfl_linear.build_adaptpfl_linear(adaptpfl_linear.AdaptPFLLinearConfig(
            d, k, alpha=alpha, learning_rate=eta, head_steps=config["head_steps"],
            shortcut_steps=config["shortcut_steps"],
            representation_steps=config["representation_steps"],
            shortcut_ridge=config["shortcut_ridge"], seed=seed,
            variant="a" if method == "fedrep_gd" else config["adaptpfl_variant"],
            project_shortcut=config["project_shortcut"],
            shortcut_damping=config["shortcut_damping"],
            head_damping=config["head_damping"], order=config["adaptpfl_order"]))
        last = _run(
            process, data, f"{tag} {method} α={alpha:g}", config["rounds"],
            lambda state, personal, process=process: evaluation(
                adaptpfl_linear.predictors(process, state, personal),
                linear_engine.get_representation(state)),
            run_dir(method if method == "fedrep_gd" else f"{method}_alpha{alpha:g}"),
            diverged=f"{method} α={alpha:g} diverged (m={num_samples}, seed={seed}); lower "
                     "--learning_rate",
            initial_state=linear_engine.set_representation(process, process.initialize(), b0))
        record(method, alpha, last["eval_error"], last["eval_dist"], started)

    if "local" in config["methods"]:
        started = time.perf_counter()
        thetas = np.stack([np.linalg.lstsq(x, y, rcond=None)[0]
                           for x, y in zip(problem.features, problem.targets)])
        record("local", None, _mean_error(thetas, problem), float("nan"), started)
    return rows


_NAMES = {"fedrep": "FedRep (exact heads, QR)", "fedrep_gd": "FedRep (gradient heads)",
          "adaptpfl": "AdaptPFL", "local": "local least squares (reference, not federated)"}


def _mean_std(values: list[float]) -> str:
    if all(np.isnan(values)):
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def write_results(rows: list[dict], config: dict) -> str:
    """results.csv (every run) and results.md (mean ± std over seeds); returns the markdown."""
    output_dir = config["output_dir"]
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["num_samples", "seed", "method", "alpha", "personalized_error",
                         "subspace_distance"])
        for r in rows:
            writer.writerow([r["num_samples"], r["seed"], r["method"],
                             "" if r["alpha"] is None else r["alpha"], f"{r['error']:.6f}",
                             "" if np.isnan(r["dist"]) else f"{r['dist']:.6f}"])
    lines = [
        f"AdaptPFL vs FedRep, personalized error (1/N) Σ_i ‖θ_i − θ_i*‖ after {config['rounds']} "
        f"rounds (mean ± std over seeds {','.join(map(str, config['seeds']))}); "
        f"N={config['num_clients']} clients, d={config['dim']}, k={config['rank']}, data "
        f"α*={config['data_alpha']:g}, ‖s_i*‖={config['shortcut_norm']:g}, "
        f"noise σ={config['noise_std']:g}; η={config['learning_rate']:g}, "
        f"τ_w={config['head_steps']}, τ_s={config['shortcut_steps']}, "
        f"τ_b={config['representation_steps']}, β={config['shortcut_ridge']:g}, "
        f"B⁰ = {config['init']}; "
        "all clients every round.",
        "",
        "| m | method | α | personalized error | dist(B, B*) |",
        "|---|---|---|---|---|",
    ]
    for m in config["num_samples"]:
        keys = list(dict.fromkeys((r["method"], r["alpha"]) for r in rows
                                  if r["num_samples"] == m))
        for method, alpha in keys:
            runs = [r for r in rows if r["num_samples"] == m and (r["method"], r["alpha"])
                    == (method, alpha)]
            lines.append(f"| {m} | {_NAMES[method]} | {'–' if alpha is None else f'{alpha:g}'} | "
                         f"{_mean_std([r['error'] for r in runs])} | "
                         f"{_mean_std([r['dist'] for r in runs])} |")
    lines += ["", f"FedRep's model θ_i = B w_i cannot express the shortcut part; its error floor "
              f"is about α*‖s_i*‖ = {config['data_alpha'] * config['shortcut_norm']:g} per "
              "client. "
              "The AdaptPFL draft has no experiments to compare with (adaptpfl.md §5)."]
    text = "\n".join(lines)
    (output_dir / "results.md").write_text(text + "\n")
    return text
