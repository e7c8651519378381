r"""Linear AdaptPFL against FedRep on clients with a personal shortcut component.

Task (`tasks.synthetic.adaptpfl_linear`, adaptpfl.md §2.7): d = 20, k = 2, N clients with m
fixed samples each, θ_i* = (1 − α*) B* w_i* + α* s_i* with B* orthonormal, ‖w_i*‖ = √k, s_i* ⊥
span(B*), ‖s_i*‖ = C_s, x ~ N(0, I_d), y = xᵀθ_i* + z, z ~ N(0, σ²). No rank-k model fits every
client: FedRep's θ_i = B w_i misses each client's shortcut part α*‖s_i*‖ (= 0.3 by default).
All clients take part every round; every method starts from the same B⁰ (FedRep's method of
moments on the clients' data, or a random orthonormal B with --init=random).

Methods:
  fedrep        `tffl.fedrep_linear`: exact least-squares heads, one step on B, mean, QR (the same
                FedRep as the FLUTE comparison in scripts/flute_synthetic.py).
  fedrep_gd     FedRep with gradient heads = `tffl.adaptpfl_linear` at α = 0: τ_w head steps,
                τ_b steps on B, mean of B (the exact α = 0 case of AdaptPFL, same schedule).
  adaptpfl      `tffl.adaptpfl_linear` at each --alphas value: τ_w head, τ_s shortcut, τ_b
                representation steps; only B is averaged.
  local         reference, not federated: each client's own least squares (minimum norm).
Personalized error: (1/N) Σ_i ‖θ_i − θ_i*‖ (the population excess risk of client i is
‖θ_i − θ_i*‖², x being isotropic), after --rounds; also dist(B, B*), the principal-angle distance.
Mean ± std over --seeds.

    .venv/bin/python scripts/adaptpfl_synthetic.py --output_dir=runs/adaptpfl_synthetic
    .venv/bin/python scripts/adaptpfl_synthetic.py --num_samples=10,20,40 --alphas=0.1,0.3,0.5

Writes results.csv (one row per run) and results.md (the printed table) to --output_dir. Every
federated run is `tffl.simulation.run_rounds` (all clients every round; the error and dist(B, B*)
are its evaluation after the last round) in --output_dir/m<m>_seed<seed>/<method>[_alpha<α>]/:
metrics.csv (every round's loss; eval_error, eval_dist at the end) and the last checkpoint; a
rerun replaces it.
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

METHODS = ("fedrep", "fedrep_gd", "adaptpfl", "local")

_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 50, "N, the number of clients.")
_NUM_SAMPLES = flags.DEFINE_list("num_samples", "20,40", "m, samples per client (one table "
                                 "block each; fixed local datasets).")
_DIM = flags.DEFINE_integer("dim", 20, "d, the feature dimension.")
_RANK = flags.DEFINE_integer("rank", 2, "k, the representation width (1 <= k < d).")
_DATA_ALPHA = flags.DEFINE_float("data_alpha", 0.3, "α* of the data model, in [0, 1].")
_SHORTCUT_NORM = flags.DEFINE_float("shortcut_norm", 1.0, "C_s = ‖s_i*‖ (>= 0).")
_ORTHOGONAL = flags.DEFINE_boolean("orthogonal_to_heads", False,
                                   "Draw shortcuts with Σ_i s_i* w_i*ᵀ = 0 (adaptpfl.md §2.6).")
_NOISE_STD = flags.DEFINE_float("noise_std", 0.1, "σ of the label noise (>= 0).")
_ALPHAS = flags.DEFINE_list("alphas", "0.3,0.5", "AdaptPFL's α values, each in (0, 1].")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.1,
                                    "η for every method (head, shortcut and B steps; FedRep's B).")
_HEAD_STEPS = flags.DEFINE_integer("head_steps", 10, "τ_w, head steps per round.")
_SHORTCUT_STEPS = flags.DEFINE_integer("shortcut_steps", 10, "τ_s, shortcut steps per round.")
_REPRESENTATION_STEPS = flags.DEFINE_integer("representation_steps", 1,
                                             "τ_b, local steps on B per round.")
_SHORTCUT_RIDGE = flags.DEFINE_float("shortcut_ridge", 0.0, "β >= 0, ridge on the shortcut.")
_VARIANT = flags.DEFINE_enum(
    "adaptpfl_variant", "a", ["a", "b"], "AdaptPFL's variant: a (Algorithm 1 repaired: tau "
    "gradient steps on head, shortcut and B) or b (the draft's analysed iteration (2)-(8): ridge "
    "shortcut and least-squares head solved exactly, one B step then QR; adaptpfl.md 1.5).")
_PROJECT_SHORTCUT = flags.DEFINE_boolean(
    "project_shortcut", True, "Variant b: project s onto span(B)'s orthogonal complement, (3).")
_SHORTCUT_DAMPING = flags.DEFINE_float("shortcut_damping", 1.0,
                                       "Variant b: lambda_S in (0, 1], (4).")
_HEAD_DAMPING = flags.DEFINE_float("head_damping", 1.0, "Variant b: lambda_W in (0, 1], (6).")
_ORDER = flags.DEFINE_enum("adaptpfl_order", "sw", ["sw", "ws"],
                           "Variant b: shortcut then head (sw, the analysis) or head first (ws).")
_INIT = flags.DEFINE_enum("init", "moments", ["moments", "random"],
                          "B⁰: FedRep's method of moments, or a random orthonormal matrix.")
_METHODS = flags.DEFINE_list("methods", ",".join(METHODS), "Methods: " + ", ".join(METHODS) + ".")
_ROUNDS = flags.DEFINE_integer("rounds", 100, "Communication rounds per run.")
_SEEDS = flags.DEFINE_list("seeds", "0,1", "Seeds (each: new ground truth, data and B⁰).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/adaptpfl_synthetic",
                                  "Where results.csv, results.md and the worker log go.")


def _list(name: str, kind, ok, requirement: str) -> list:
    text = flags.FLAGS[name].value
    try:
        values = [kind(v) for v in text]
    except ValueError:
        values = None
    if not values or not all(ok(v) for v in values):
        raise UsageError(f"flag --{name}={','.join(text)}: {requirement}")
    if len(set(values)) != len(values):
        raise UsageError(f"flag --{name}={','.join(text)}: values repeat")
    return values


def _validate_flags() -> dict:
    """Checks the flags together; returns the parsed lists and the (writable) output dir."""
    for name in ("num_clients", "dim", "rounds"):
        if flags.FLAGS[name].value < 1:
            raise UsageError(f"flag --{name}={flags.FLAGS[name].value}: must be >= 1")
    if not 1 <= _RANK.value < _DIM.value:
        raise UsageError(f"flag --rank={_RANK.value}: must be in [1, --dim={_DIM.value})")
    for name in ("head_steps", "shortcut_steps", "representation_steps"):
        if flags.FLAGS[name].value < 0:
            raise UsageError(f"flag --{name}={flags.FLAGS[name].value}: must be >= 0")
    if not (np.isfinite(_LEARNING_RATE.value) and _LEARNING_RATE.value > 0):
        raise UsageError(f"flag --learning_rate={_LEARNING_RATE.value}: must be > 0")
    for name in ("shortcut_norm", "noise_std", "shortcut_ridge"):
        value = flags.FLAGS[name].value
        if not (np.isfinite(value) and value >= 0):
            raise UsageError(f"flag --{name}={value}: must be >= 0")
    for name in ("shortcut_damping", "head_damping"):
        value = flags.FLAGS[name].value
        if not (np.isfinite(value) and 0.0 < value <= 1.0):
            raise UsageError(f"flag --{name}={value}: must be in (0, 1]")
    if not 0.0 <= _DATA_ALPHA.value <= 1.0:
        raise UsageError(f"flag --data_alpha={_DATA_ALPHA.value}: must be in [0, 1]")
    if _ORTHOGONAL.value and _NUM_CLIENTS.value <= _RANK.value:
        raise UsageError(f"flag --orthogonal_to_heads needs --num_clients > --rank "
                         f"({_NUM_CLIENTS.value} <= {_RANK.value})")
    config = dict(
        num_samples=_list("num_samples", int, lambda v: v >= 1, "must be integers >= 1"),
        alphas=_list("alphas", float, lambda v: 0.0 < v <= 1.0,
                     "must be numbers in (0, 1] (α = 0 is the fedrep_gd method)"),
        seeds=_list("seeds", int, lambda v: v >= 0, "must be integers >= 0"),
    )
    if _VARIANT.value == "b" and any(a >= 1.0 for a in config["alphas"]):
        raise UsageError(f"flag --alphas={','.join(_ALPHAS.value)}: --adaptpfl_variant=b solves "
                         "the head with a 1/(1-alpha) factor; every alpha must be < 1")
    unknown = [m for m in _METHODS.value if m not in METHODS]
    if unknown or not _METHODS.value:
        raise UsageError(f"flag --methods={','.join(_METHODS.value)}: unknown "
                         f"{', '.join(unknown) or 'empty'}; choose from {', '.join(METHODS)}")
    config["methods"] = [m for m in METHODS if m in _METHODS.value]
    output_dir = cli.writable_output_dir(_OUTPUT_DIR.value)
    config["output_dir"] = output_dir
    return config


def _mean_error(thetas: np.ndarray, problem) -> float:
    return float(np.mean(np.linalg.norm(thetas - problem.thetas, axis=1)))


def _run(process, data: list, label: str, evaluate, run_dir: pathlib.Path | None,
         diverged: str | None = None, initial_state=None) -> dict:
    """--rounds rounds of `process` (all clients, each on its fixed data, every round) with
    `tffl.simulation.run_rounds` in `run_dir`, the loss printed every tenth round; returns the last
    round's metrics row, whose eval_* are `evaluate(state, personal states in client order or
    None)` after the last round. `diverged`: the message of the FloatingPointError raised at the
    first round whose loss is not finite (None: no check); `initial_state`: where round 1 starts
    (default `process.initialize()`)."""
    from tffl import participation
    from tffl import simulation

    ids = [f"client_{i:03d}" for i in range(len(data))]
    by_id, rounds = dict(zip(ids, data)), _ROUNDS.value

    def after_round(row, _) -> None:  # every round's metrics row
        t, loss = row["round"], row["loss"]
        if diverged is not None and not np.isfinite(loss):
            raise FloatingPointError(diverged)
        if t % max(1, rounds // 10) == 0 or t == rounds:
            print(f"  {label}: round {t}/{rounds}, loss {loss:.4f}", flush=True)

    with cli.run_directory(run_dir, prefix="adaptpfl_synthetic_") as output_dir:
        result = simulation.run_rounds(
            process, participation.FullParticipation(ids), lambda cid, _: by_id[cid], rounds,
            output_dir, evaluate_fn=lambda state, store=None: evaluate(
                state, None if store is None else store.lookup(ids)),
            checkpoint_every=rounds, log=None, tensorboard=False, after_round=after_round,
            initial_state=initial_state)
    return result.history[-1]


def run_setting(num_samples: int, seed: int, config: dict) -> list[dict]:
    """All methods on one (m, seed); one result row per method. Inside `local_runtime()`. Each
    federated run goes to `<config["output_dir"]>/m<m>_seed<seed>/<method>[_alpha<α>]/` (a
    temporary directory if `config` has no output_dir)."""
    from tasks import subspace
    from tasks import synthetic
    from tffl import adaptpfl_linear
    from tffl import fedrep_linear

    d, k, eta = _DIM.value, _RANK.value, _LEARNING_RATE.value
    problem = synthetic.adaptpfl_linear(
        _NUM_CLIENTS.value, num_samples, d, k, alpha=_DATA_ALPHA.value,
        shortcut_norm=_SHORTCUT_NORM.value, orthogonal_to_heads=_ORTHOGONAL.value,
        noise_std=_NOISE_STD.value, seed=seed)
    data = [collections.OrderedDict(x=x.astype(np.float32), y=y.astype(np.float32))
            for x, y in zip(problem.features, problem.targets)]
    fedrep = fedrep_linear.build_fedrep_linear(d, k, eta, seed=seed)
    state = (fedrep.initialize_by_moments(data) if _INIT.value == "moments"
             else fedrep.initialize())
    b0 = fedrep.get_representation(state)
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
            b = fedrep.get_representation(state).astype(np.float64)
            heads = np.stack([np.linalg.lstsq(x @ b, y, rcond=None)[0]
                              for x, y in zip(problem.features, problem.targets)])
            return evaluation(heads @ b.T, b)

        last = _run(fedrep, data, f"{tag} fedrep", fedrep_evaluation, run_dir("fedrep"),
                    initial_state=state)
        record("fedrep", None, last["eval_error"], last["eval_dist"], started)

    runs = ([("fedrep_gd", 0.0)] if "fedrep_gd" in config["methods"] else []) + (
        [("adaptpfl", a) for a in config["alphas"]] if "adaptpfl" in config["methods"] else [])
    for method, alpha in runs:
        started = time.perf_counter()
        process = adaptpfl_linear.build_adaptpfl_linear(
            d, k, alpha=alpha, learning_rate=eta, head_steps=_HEAD_STEPS.value,
            shortcut_steps=_SHORTCUT_STEPS.value,
            representation_steps=_REPRESENTATION_STEPS.value,
            shortcut_ridge=_SHORTCUT_RIDGE.value, seed=seed,
            variant="a" if method == "fedrep_gd" else _VARIANT.value,
            project_shortcut=_PROJECT_SHORTCUT.value, shortcut_damping=_SHORTCUT_DAMPING.value,
            head_damping=_HEAD_DAMPING.value, order=_ORDER.value)
        last = _run(
            process, data, f"{tag} {method} α={alpha:g}",
            lambda state, personal, process=process: evaluation(
                process.predictors(state, personal), process.get_representation(state)),
            run_dir(method if method == "fedrep_gd" else f"{method}_alpha{alpha:g}"),
            diverged=f"{method} α={alpha:g} diverged (m={num_samples}, seed={seed}); lower "
                     "--learning_rate",
            initial_state=process.set_representation(process.initialize(), b0))
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
        f"AdaptPFL vs FedRep, personalized error (1/N) Σ_i ‖θ_i − θ_i*‖ after {_ROUNDS.value} "
        f"rounds (mean ± std over seeds {','.join(map(str, config['seeds']))}); "
        f"N={_NUM_CLIENTS.value} clients, d={_DIM.value}, k={_RANK.value}, data "
        f"α*={_DATA_ALPHA.value:g}, ‖s_i*‖={_SHORTCUT_NORM.value:g}, noise σ={_NOISE_STD.value:g}; "
        f"η={_LEARNING_RATE.value:g}, τ_w={_HEAD_STEPS.value}, τ_s={_SHORTCUT_STEPS.value}, "
        f"τ_b={_REPRESENTATION_STEPS.value}, β={_SHORTCUT_RIDGE.value:g}, B⁰ = {_INIT.value}; "
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
              f"is about α*‖s_i*‖ = {_DATA_ALPHA.value * _SHORTCUT_NORM.value:g} per client. "
              "The AdaptPFL draft has no experiments to compare with (adaptpfl.md §5)."]
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
            for m in config["num_samples"]:
                for seed in config["seeds"]:
                    rows += run_setting(m, seed, config)
    except UsageError as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"adaptpfl_synthetic.py: error: {e}\n")
        return 2
    except (ValueError, FloatingPointError, OSError) as e:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"adaptpfl_synthetic.py: error: {e}\n")
        return 1
    print("\n" + write_results(rows, config) + "\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; results in {config['output_dir']}",
          flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
