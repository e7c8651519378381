"""Experiment 1, `rolora_linear`: RoLoRA vs FFA-LoRA vs FedAvg-LoRA on the rank-1 linear model."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence

from runner.report import Column, Panel, Series, Table, missing
from runner.running import METHOD_NAMES, Context, Result, load_unit, mean_of, save_unit

# ------------------------------------------------------------------------------------------------
# 1. rolora_linear


LINEAR_METHODS = ("rolora", "ffa_lora", "fedavg_lora")


@dataclasses.dataclass(frozen=True)
class LinearExperimentConfig:
    dim: int
    num_clients: int
    num_samples: int
    local_steps: int
    learning_rate: float
    rounds: int
    seeds: int
    heterogeneity: float = 1.0
    threshold: float = 1e-3

    def settings(self) -> dict[str, float]:
        return {"homogeneous": 0.0, "heterogeneous": self.heterogeneity}


LINEAR_SCALES = {
    "small": LinearExperimentConfig(dim=10, num_clients=5, num_samples=1000, local_steps=10,
                          learning_rate=0.1, rounds=40, seeds=1),
    "full": LinearExperimentConfig(dim=50, num_clients=10, num_samples=2000, local_steps=10,
                         learning_rate=0.1, rounds=100, seeds=5),
}


def lora_processes(config: LinearExperimentConfig, methods: Sequence[str] = LINEAR_METHODS,
                     a0=None) -> dict:
    """The TFF processes of `methods` on f(X) = X·a·bᵀ (a: d×1 `lora_a`, b: 1×d `lora_b`) with
    the paper's loss (1/m)‖Y − X a bᵀ‖²_F per batch, starting from a = `a0` if given (needed
    for FFA-LoRA, whose a is frozen and so part of the model, not of the state)."""
    import numpy as np
    import tensorflow as tf

    from models.paper_models import LowRankDense
    from tffl.algorithms import lora_fl

    d = config.dim

    def model_fn():
        x = tf.keras.Input((d,))
        return tf.keras.Model(x, LowRankDense(d, 1, name="lora")(x))

    def loss_fn():
        return lambda y, p: tf.reduce_mean(tf.reduce_sum(tf.square(y - p), axis=-1))

    spec = (tf.TensorSpec([None, d], tf.float32), tf.TensorSpec([None, d], tf.float32))
    start = None if a0 is None else [np.asarray(a0, np.float32),
                                     np.zeros((1, d), np.float32)]
    return {m: lora_fl.build_lora_process(m, model_fn, spec, config.learning_rate,
                                          loss_fn=loss_fn, initial_trainable=start)
            for m in methods}


def linear_problem(config: LinearExperimentConfig, setting: str, seed: int):
    """The data and a⁰ (a unit vector, the same for every method) of one setting and seed."""
    import numpy as np

    from tasks.synthetic import rolora_linear

    problem = rolora_linear(num_clients=config.num_clients, num_samples=config.num_samples,
                            dim=config.dim, heterogeneity=config.settings()[setting], seed=seed)
    rng = np.random.default_rng([seed, 7])
    a0 = rng.standard_normal((config.dim, 1))
    return problem, a0 / np.linalg.norm(a0)


def _global_loss(problem, a, b) -> float:
    """(1/N) Σ_i (1/m)‖Y_i − X_i a bᵀ‖²_F."""
    import numpy as np

    a = np.asarray(a, np.float64).reshape(-1, 1)
    b = np.asarray(b, np.float64).reshape(1, -1)
    residual = problem.features @ a @ b - problem.targets
    return float(np.mean(np.sum(residual ** 2, axis=-1)))


def centralized_optimum(problem, a0, iterations: int = 2000):
    """Alternating least squares on the pooled objective Σ_i ‖Y_i − X_i a bᵀ‖² from a⁰: the
    minimizer the federated methods aim at; returns (a, b)."""
    import numpy as np

    x = problem.features.reshape(-1, problem.features.shape[-1])
    y = problem.targets.reshape(-1, problem.targets.shape[-1])
    gram = x.T @ x
    xty = x.T @ y
    a = np.asarray(a0, np.float64).ravel()
    b = np.zeros(y.shape[1])
    for _ in range(iterations):
        xa = x @ a
        b = y.T @ xa / (xa @ xa)
        a_new = np.linalg.solve(gram, xty @ b) / (b @ b)
        a_new /= np.linalg.norm(a_new)
        if np.linalg.norm(a_new - a) < 1e-13:
            a = a_new
            break
        a = a_new
    xa = x @ a
    b = y.T @ xa / (xa @ xa)
    return a, b


def linear_unit(config: LinearExperimentConfig, processes: dict, setting: str, method: str,
                seed: int, output_dir: os.PathLike | str | None = None) -> dict:
    """One method on one problem, driven by `tffl.simulation.driver.run_rounds` (its metrics.csv and
    checkpoints go to `output_dir`, default a temporary folder); must run inside
    `tffl.runtime.local_runtime()`. Returns sin θ(a, a*) and the global loss after every
    communication round (index 0: the start)."""
    import tempfile

    import numpy as np
    import tensorflow as tf

    from tasks.subspace import sin_theta
    from tffl.simulation import driver, participation

    problem, a0 = linear_problem(config, setting, seed)
    m = config.num_samples
    ids = [f"client_{i}" for i in range(config.num_clients)]
    datasets = {cid: tf.data.Dataset.from_tensor_slices(
        (problem.features[i].astype(np.float32), problem.targets[i].astype(np.float32)))
        .batch(m).repeat(config.local_steps) for i, cid in enumerate(ids)}
    process, start = processes[method], None
    if len(process.model.layout.trainable) < 2:   # a is frozen (FFA-LoRA): a0 is in the model
        process = lora_processes(config, (method,), a0=a0)[method]
    else:                                          # a and b travel: a0 goes into the state
        state = process.initialize()
        full = process.model_weights(state)
        start = process.with_model_weights(state, type(full)(
            trainable=[a0.astype(np.float32), np.zeros((1, config.dim), np.float32)],
            non_trainable=full.non_trainable))

    def evaluate(state):
        a, b = process.model_weights(state).trainable
        return {"sin_theta": sin_theta(a, problem.a_star), "loss": _global_loss(problem, a, b)}

    with tempfile.TemporaryDirectory() as tmp:
        result = driver.run_rounds(
            process, participation.FullParticipation(ids), lambda cid, t: datasets[cid],
            config.rounds, output_dir or tmp,
            driver.RunOptions(
                evaluate_fn=evaluate, eval_every=1, checkpoint_every=max(1, config.rounds // 4),
                log=None, tensorboard=False, resume=output_dir is not None, initial_state=start))
    angles = [sin_theta(a0, problem.a_star)] + [r["eval_sin_theta"] for r in result.history]
    losses = [_global_loss(problem, a0, np.zeros(config.dim))] + [
        r["eval_loss"] for r in result.history]
    return {"setting": setting, "method": method, "seed": seed,
            "communication_rounds": config.rounds, "sin_theta": angles, "loss": losses,
            "upload_floats": (2 if method == "fedavg_lora" else 1) * config.dim}


def _linear_reference(config: LinearExperimentConfig, setting: str, seed: int) -> dict:
    import numpy as np

    from tasks.subspace import sin_theta

    problem, a0 = linear_problem(config, setting, seed)
    a, b = centralized_optimum(problem, a0)
    delta0 = sin_theta(a0, problem.a_star)
    n, m = config.num_clients, config.num_samples
    b_bar = problem.b_bar
    gamma2 = problem.client_variance
    if gamma2 == 0:
        c_tilde = (n * (4 - m) - 2) / (n ** 2 * m * (m - 2))
        ffa = (1 + c_tilde) * float(b_bar @ b_bar) * delta0 ** 2  # Prop. 4.6
        rolora = 0.0                                                 # Thm 4.5, ε → 0
    else:
        ffa = gamma2 + float(b_bar @ b_bar) * delta0 ** 2          # Prop. A3.17 (population)
        rolora = gamma2                                              # Thm A3.14, ε → 0
    return {"sin_theta": sin_theta(a, problem.a_star),
            "loss": _global_loss(problem, a, b), "theory_ffa": ffa, "theory_rolora": rolora,
            "b_norm": float(np.linalg.norm(b_bar)), "gamma2": gamma2}


def _first_at_or_below(values: Sequence[float], threshold: float):
    for t, v in enumerate(values):
        if v <= threshold:
            return t
    return None


def run_rolora_linear(ctx: Context) -> Result:
    from tffl import runtime

    config = LINEAR_SCALES[ctx.scale]
    seeds = [ctx.seed + s for s in range(config.seeds)]
    units: dict[tuple, dict] = {}
    todo = []
    for setting in config.settings():
        for method in LINEAR_METHODS:
            for seed in seeds:
                key = f"linear-{setting}-{method}-seed{seed}"
                found = load_unit(ctx, key)
                if found is not None:
                    units[setting, method, seed] = found
                else:
                    todo.append((setting, method, seed, key))
    if todo:
        with runtime.local_runtime(log_dir=ctx.output_dir):
            processes = lora_processes(config)
            for setting, method, seed, key in todo:
                started = time.perf_counter()
                unit = linear_unit(config, processes, setting, method, seed,
                                   output_dir=ctx.output_dir / "runs" / key)
                save_unit(ctx, key, unit)
                units[setting, method, seed] = unit
                ctx.log(f"{setting} {METHOD_NAMES[method]} seed {seed}: sin θ "
                        f"{unit['sin_theta'][0]:.3g} -> {unit['sin_theta'][-1]:.3g} after "
                        f"{unit['communication_rounds']} communication rounds, "
                        f"{time.perf_counter() - started:.1f} s")
    references = {(s, seed): _linear_reference(config, s, seed)
                  for s in config.settings() for seed in seeds}
    t_quarter, t_half = config.rounds // 4, config.rounds // 2
    rows = []
    for setting in config.settings():
        for method in LINEAR_METHODS:
            runs = [units[setting, method, seed] for seed in seeds]
            hits = [_first_at_or_below(u["sin_theta"], config.threshold) for u in runs]
            reached = [h for h in hits if h is not None]
            theory = [references[setting, seed]["theory_rolora" if method == "rolora"
                                                else "theory_ffa"] for seed in seeds]
            rows.append({
                "setting": setting, "method": METHOD_NAMES[method],
                "communication_rounds": runs[0]["communication_rounds"],
                "initial_sin_theta": mean_of([u["sin_theta"][0] for u in runs]),
                f"sin_theta_round_{t_quarter}": mean_of([u["sin_theta"][t_quarter] for u in runs]),
                f"sin_theta_round_{t_half}": mean_of([u["sin_theta"][t_half] for u in runs]),
                "final_sin_theta": mean_of([u["sin_theta"][config.rounds] for u in runs]),
                "rounds_to_threshold": (
                    f"{mean_of(reached):.1f}" + ("" if len(reached) == len(runs)
                                               else f" ({len(reached)}/{len(runs)} seeds)")
                    if reached else "not reached"),
                "final_loss": mean_of([u["loss"][config.rounds] for u in runs]),
                "excess_loss": mean_of([u["loss"][config.rounds]
                                      - references[setting, seed]["loss"]
                                      for u, seed in zip(runs, seeds)]),
                "theory_loss": None if method == "fedavg_lora" else mean_of(theory),
                "upload_floats": runs[0]["upload_floats"],
            })
        rows.append({
            "setting": setting, "method": "centralized optimum (numpy ALS, reference)",
            "final_sin_theta": mean_of([references[setting, s]["sin_theta"] for s in seeds]),
            "final_loss": mean_of([references[setting, s]["loss"] for s in seeds]),
            "excess_loss": 0.0,
        })
    columns = [
        Column("setting", "setting"), Column("method", "method"),
        Column("comm. rounds", "communication_rounds"),
        Column("initial sin θ", "initial_sin_theta", "{:.3g}"),
        Column(f"sin θ @ round {t_quarter}", f"sin_theta_round_{t_quarter}", "{:.3g}"),
        Column(f"sin θ @ round {t_half}", f"sin_theta_round_{t_half}", "{:.3g}"),
        Column("final sin θ", "final_sin_theta", "{:.3g}"),
        Column(f"first round with sin θ ≤ {config.threshold:g}", "rounds_to_threshold"),
        Column("final global loss", "final_loss", "{:.6g}"),
        Column("loss − optimum's", "excess_loss", "{:.2g}"),
        Column("theory: loss limit", "theory_loss", "{:.4g}"),
        Column("upload floats/client/round", "upload_floats"),
    ]
    gamma = config.heterogeneity
    title = (
        f"RoLoRA linear theory (rolora.md §2.1–2.2): Y_i = X_i a* b_i*ᵀ, f = X a bᵀ (rank 1), "
        f"a⁰ a random unit vector, b⁰ = 0; d = {config.dim}, N = {config.num_clients} clients × "
        f"m = {config.num_samples} samples, {config.local_steps} full-batch local GD steps per "
        f"communication round, η = {config.learning_rate:g}, all clients every round, "
        f"{config.rounds} communication rounds; homogeneous: b_i* = b*, ‖b*‖ = 1; "
        f"heterogeneous: γ = {gamma:g}, ‖b̄*‖ = 1. "
        + (f"Mean over seeds {seeds[0]}–{seeds[-1]}." if len(seeds) > 1 else f"Seed {seeds[0]}.")
        + " Global loss = (1/N) Σ_i (1/m)‖Y_i − X_i a bᵀ‖²_F on the training data.")
    notes = [
        "Theory (rolora.md §2): RoLoRA drives sin θ(a, a*) to 0 at a linear rate (Thm 4.5; "
        "heterogeneous: Thm A3.14), so its loss tends to (1+c̃)‖b*‖²ε² → 0 (homogeneous) or γ² "
        "(heterogeneous, population loss). FFA-LoRA never moves a, so sin θ stays at δ0 and its "
        "expected loss is (1+c̃)‖b*‖²δ0² (Prop. 4.6) or γ² + ‖b̄*‖²δ0² (Prop. A3.17). The paper "
        "has no numerical linear experiment (rolora.md §2.4); this one is designed here. "
        "FedAvg-LoRA has no theory in the paper.",
    ]
    panels = []
    for setting in config.settings():
        series = []
        for method, style in zip(LINEAR_METHODS, ("-", "--", ":")):
            runs = [units[setting, method, seed] for seed in seeds]
            curve = [_median([u["sin_theta"][t] for u in runs]) for t in range(config.rounds + 1)]
            series.append(Series(METHOD_NAMES[method], range(config.rounds + 1),
                                 [max(v, 1e-9) for v in curve], style))
        ref = _median([references[setting, s]["sin_theta"] for s in seeds])
        panels.append(Panel(
            f"{setting} (d={config.dim}, N={config.num_clients}, m={config.num_samples})",
            "communication round", "sin θ(a, a*)" + (" (median over seeds)" if len(seeds) > 1
                                                     else ""),
            series, logy=True, hlines=[("centralized optimum", max(ref, 1e-9))]))
    return Result(Table(title, columns, rows, notes), panels,
                  "RoLoRA vs FFA-LoRA vs FedAvg-LoRA on the rank-1 linear model")


def _median(values) -> float:
    values = sorted(v for v in values if not missing(v))
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
