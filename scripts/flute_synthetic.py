r"""Linear FLUTE against FedRep on FLUTE's under-parameterized synthetic task (App. C.1, Figure 3).

Task (`tasks.synthetic.flute_linear`, flute.md §5.1): d = 10, M clients, N samples per client
(N is *samples per client* here, as in the paper's Sections 3–5 and App. C.1), Φ = U Λ Vᵀ with
λ_i = 2d̲/(i+1) (rank Φ = min(d, M) = 10 > k: under-parameterized), x ~ N(0, I_d),
y = φ_iᵀx + ξ with ξ ~ N(0, 0.3). Each client keeps its fixed dataset and uses all of it every
round; all M clients take part every round.

Methods (every one sees the same data; per seed a new Φ, data and initialization):
  flute        `tffl.flute_linear` (Algorithm 1), η_l = η_r = --learning_rate, γ1, γ2, random init
               N(0, α²), α = 1/(10d).
  fedrep_ri    `tffl.fedrep_linear` (FedRep as flute.md §5.4 defines it: exact least-squares heads,
               one local step on B, mean, QR) started from FLUTE's B⁰ (orthonormalized) —
               the paper's FedRep(RI). One run per --fedrep_learning_rates value.
  fedrep_mom   the same FedRep from the method-of-moments B⁰ (the paper's Figure 1 "FedRep").
The error is the paper's (1/M) Σ_i ‖B w_i − φ_i‖ (FedRep's w_i: the exact heads for its B),
reported at --report_rounds and after --rounds; the floor is the noise-free rank-k optimum
(1/M) Σ_i ‖B*w_i* − φ_i‖ (Eckart–Young, B*W* = U_kΛ_kV_kᵀ). Mean ± std over --seeds.

    .venv/bin/python scripts/flute_synthetic.py --output_dir=runs/flute_synthetic
    .venv/bin/python scripts/flute_synthetic.py --ks=2,4,6,8 --num_clients=15,30 --seeds=0,1,2

Writes results.csv (one row per run: M, k, seed, method, η, error at each report round) and
results.md (the table printed at the end) to --output_dir; the TFF worker's log goes there too.
Every run is `tffl.simulation.run_rounds` (all clients every round; the error is its evaluation at
the report rounds and the last) in --output_dir/M<M>_k<k>_seed<seed>/<method>_eta<η>/: metrics.csv
(every round's loss, eval_error at those rounds) and the last checkpoint; a rerun replaces it.
"""

from __future__ import annotations

import os
import sys
import warnings

if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")

import collections  # noqa: E402
import csv  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from experiments import cli  # noqa: E402
from experiments.cli import UsageError  # noqa: E402

# TensorFlow, TFF and tffl are imported in `main` after the flags are checked, so that a bad flag
# is reported in a second; `tffl.runtime` (whose exit hook stops any TFF worker) is imported
# before any worker is started.

METHODS = ("flute", "fedrep_ri", "fedrep_mom")
PAPER_TREND = (
    "Paper (flute.md §5.3; Figures 1 and 3 are curves, no numbers): FLUTE beats FedRep(RI) in far "
    "fewer iterations; with d, M, N fixed, increasing k shrinks the gap in convergence speed "
    "between FLUTE and FedRep; with d, k, N fixed, increasing M lowers FLUTE's average error."
)

_KS = flags.DEFINE_list("ks", "2,4", "Representation widths k (each in [1, dim]).")
_NUM_CLIENTS = flags.DEFINE_list("num_clients", "30", "Numbers of clients M.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 20, "N, samples per client (fixed dataset).")
_DIM = flags.DEFINE_integer("dim", 10, "d, the feature dimension.")
_NOISE_VARIANCE = flags.DEFINE_float("noise_variance", 0.3, "Variance of the label noise ξ.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.03, "FLUTE's η_l = η_r (paper: 0.03).")
_GAMMA1 = flags.DEFINE_float("gamma1", 0.25, "FLUTE's γ1 (theory: 1/4).")
_GAMMA2 = flags.DEFINE_float("gamma2", 0.125, "FLUTE's γ2 (theory: 1/8).")
_FEDREP_LEARNING_RATES = flags.DEFINE_list(
    "fedrep_learning_rates", "0.03,0.3",
    "FedRep(RI) step sizes η (one run each; 0.03 is the paper's η; FedRep averages the clients' "
    "B-steps where FLUTE sums them, so its step is effectively M times smaller at equal η).")
_METHODS = flags.DEFINE_list("methods", ",".join(METHODS), "Methods: " + ", ".join(METHODS) + ".")
_ROUNDS = flags.DEFINE_integer("rounds", 200, "Communication rounds per run.")
_REPORT_ROUNDS = flags.DEFINE_list("report_rounds", "25,50,100",
                                   "Rounds (< --rounds) whose error is also reported.")
_SEEDS = flags.DEFINE_list("seeds", "0,1", "Seeds (each: new Φ, data and initialization).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/flute_synthetic",
                                  "Where results.csv, results.md and the worker log go.")


def _int_list(name: str, minimum: int, maximum: int | None = None) -> list[int]:
    text = flags.FLAGS[name].value
    try:
        values = [int(v) for v in text]
    except ValueError:
        raise UsageError(f"flag --{name}={','.join(text)}: not a list of integers") from None
    if not values:
        raise UsageError(f"flag --{name}: empty")
    for v in values:
        if v < minimum or (maximum is not None and v > maximum):
            bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
            raise UsageError(f"flag --{name}={','.join(text)}: {v} must be {bound}")
    if len(set(values)) != len(values):
        raise UsageError(f"flag --{name}={','.join(text)}: values repeat")
    return values


def _validate_flags() -> dict:
    """Checks the flags together; returns the parsed lists and the (writable) output dir."""
    for name in ("num_samples", "dim", "rounds"):
        if flags.FLAGS[name].value < 1:
            raise UsageError(f"flag --{name}={flags.FLAGS[name].value}: must be >= 1")
    config = dict(
        ks=_int_list("ks", 1, _DIM.value),
        num_clients=_int_list("num_clients", 1),
        report_rounds=sorted(_int_list("report_rounds", 1, _ROUNDS.value - 1))
        if _REPORT_ROUNDS.value else [],
        seeds=_int_list("seeds", 0),
    )
    if not (np.isfinite(_LEARNING_RATE.value) and _LEARNING_RATE.value > 0):
        raise UsageError(f"flag --learning_rate={_LEARNING_RATE.value}: must be > 0")
    for name in ("gamma1", "gamma2", "noise_variance"):
        value = flags.FLAGS[name].value
        if not (np.isfinite(value) and value >= 0):
            raise UsageError(f"flag --{name}={value}: must be >= 0")
    try:
        rates = [float(v) for v in _FEDREP_LEARNING_RATES.value]
    except ValueError:
        rates = [-1.0]
    if not rates or any(not (np.isfinite(r) and r > 0) for r in rates):
        raise UsageError(f"flag --fedrep_learning_rates={','.join(_FEDREP_LEARNING_RATES.value)}: "
                         "must be numbers > 0")
    config["fedrep_learning_rates"] = rates
    unknown = [m for m in _METHODS.value if m not in METHODS]
    if unknown or not _METHODS.value:
        raise UsageError(f"flag --methods={','.join(_METHODS.value)}: unknown "
                         f"{', '.join(unknown) or 'empty'}; choose from {', '.join(METHODS)}")
    config["methods"] = [m for m in METHODS if m in _METHODS.value]
    output_dir = cli.writable_output_dir(_OUTPUT_DIR.value)
    config["output_dir"] = output_dir
    return config


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
    """--rounds rounds of `process` (all clients, each on its fixed data, every round) with
    `tffl.simulation.run_rounds` in `run_dir`; the error at every checkpoint round, with progress
    lines. `error_fn(state, personal states in client order or None)`; `diverged`: the message of
    the FloatingPointError raised at the first round whose loss is not finite (None: no check);
    `initial_state`: where round 1 starts (default `process.initialize()`)."""
    from tffl import participation
    from tffl import simulation

    ids = [f"client_{i:03d}" for i in range(len(data))]
    by_id, rounds, started = dict(zip(ids, data)), _ROUNDS.value, time.perf_counter()

    def evaluate(state, store=None):  # the state after round `round_num`
        if int(state["round_num"]) not in checkpoints:
            return {}
        return {"error": error_fn(state, None if store is None else store.lookup(ids))}

    def after_round(row, _) -> None:  # every round's metrics row
        if diverged is not None and not np.isfinite(row["loss"]):
            raise FloatingPointError(diverged)
        if "eval_error" in row:
            print(f"  {label}: round {row['round']}/{rounds}, error {row['eval_error']:.4f} "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)

    with cli.run_directory(run_dir, prefix="flute_synthetic_") as output_dir:
        result = simulation.run_rounds(
            process, participation.FullParticipation(ids), lambda cid, _: by_id[cid], rounds,
            output_dir, evaluate_fn=evaluate, eval_every=1, checkpoint_every=rounds, log=None,
            tensorboard=False, after_round=after_round, initial_state=initial_state)
    return {row["round"]: row["eval_error"] for row in result.history if "eval_error" in row}


def run_setting(num_clients: int, k: int, seed: int, config: dict) -> list[dict]:
    """All methods on one (M, k, seed); one result row per run. Inside `local_runtime()`. Each run
    goes to `<config["output_dir"]>/M<M>_k<k>_seed<seed>/<method>_eta<η>/` (a temporary directory
    if `config` has no output_dir)."""
    from tasks import synthetic
    from tffl import fedrep_linear
    from tffl import flute_linear

    problem = synthetic.flute_linear(num_clients, _NUM_SAMPLES.value, _DIM.value,
                                     noise_std=float(np.sqrt(_NOISE_VARIANCE.value)), seed=seed)
    data = _data(problem)
    floor = _mean_error(problem.optimal_predictors(k).T, problem.phi)
    checkpoints = config["report_rounds"] + [_ROUNDS.value]
    base = dict(num_clients=num_clients, k=k, seed=seed, floor=floor)
    rows = []
    flute = flute_linear.build_flute_linear(_DIM.value, k, _LEARNING_RATE.value,
                                            gamma1=_GAMMA1.value, gamma2=_GAMMA2.value, seed=seed)
    flute_b0 = flute.get_representation(flute.initialize())
    tag = f"[M={num_clients} k={k} seed={seed}]"
    print(f"{tag} rank-k optimum (floor) {floor:.4f}", flush=True)
    root = config.get("output_dir")
    setting_dir = None if root is None else pathlib.Path(root) / f"M{num_clients}_k{k}_seed{seed}"

    def run_dir(method: str, eta: float) -> pathlib.Path | None:
        return None if setting_dir is None else setting_dir / f"{method}_eta{eta:g}"

    if "flute" in config["methods"]:
        errors = _run(
            flute, data, f"{tag} flute η={_LEARNING_RATE.value:g}", checkpoints,
            lambda state, personal: _mean_error(flute.predictors(state, personal), problem.phi),
            run_dir("flute", _LEARNING_RATE.value),
            diverged=f"FLUTE diverged (M={num_clients}, k={k}, seed={seed}); lower --learning_rate")
        rows.append(base | dict(method="flute", learning_rate=_LEARNING_RATE.value,
                                errors=errors))

    for init in ("ri", "mom"):
        if f"fedrep_{init}" not in config["methods"]:
            continue
        rates = config["fedrep_learning_rates"] if init == "ri" else \
            config["fedrep_learning_rates"][:1]
        for eta in rates:
            fedrep = fedrep_linear.build_fedrep_linear(_DIM.value, k, eta, seed=seed)
            if init == "ri":
                state = fedrep.set_representation(fedrep.initialize(), flute_b0)
            else:
                state = fedrep.initialize_by_moments(data)
            errors = _run(
                fedrep, data, f"{tag} fedrep_{init} η={eta:g}", checkpoints,
                lambda state, _, fedrep=fedrep: _mean_error(_fedrep_predictors(
                    fedrep.get_representation(state), problem), problem.phi),
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
    checkpoints = config["report_rounds"] + [_ROUNDS.value]
    with open(output_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["num_clients", "k", "seed", "method", "learning_rate", "floor"]
                        + [f"error_round_{t}" for t in checkpoints])
        for r in rows:
            writer.writerow([r["num_clients"], r["k"], r["seed"], r["method"], r["learning_rate"],
                             f"{r['floor']:.6f}"] + [f"{r['errors'][t]:.6f}" for t in checkpoints])
    seeds = config["seeds"]
    header = (["M", "k", "method", "η"] + [f"round {t}" for t in config["report_rounds"]]
              + [f"final (round {_ROUNDS.value})"])
    lines = [
        f"FLUTE vs FedRep, error (1/M) Σ_i ‖B w_i − φ_i‖ (mean ± std over seeds "
        f"{','.join(map(str, seeds))}); d={_DIM.value}, N={_NUM_SAMPLES.value} samples per "
        f"client, noise variance {_NOISE_VARIANCE.value:g}, FLUTE γ1={_GAMMA1.value:g}, "
        f"γ2={_GAMMA2.value:g}, η_l=η_r={_LEARNING_RATE.value:g}, init α=1/(10d); all clients "
        "every round.",
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


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = _validate_flags()
        import tensorflow as tf

        from tffl import runtime

        if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
            import logging
            tf.get_logger().setLevel(logging.ERROR)
            logging.getLogger("absl").setLevel(logging.ERROR)
        started = time.perf_counter()
        rows = []
        with runtime.local_runtime(log_dir=config["output_dir"]):
            for m in config["num_clients"]:
                for k in config["ks"]:
                    for seed in config["seeds"]:
                        rows += run_setting(m, k, seed, config)
    except UsageError as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"flute_synthetic.py: error: {e}\n")
        return 2
    except (ValueError, FloatingPointError, OSError) as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"flute_synthetic.py: error: {e}\n")
        return 1
    print("\n" + write_results(rows, config) + "\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; results in {config['output_dir']}",
          flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
