"""Experiments 6 and 7: `flute_synthetic` and `adaptpfl_synthetic`, in this process through
their library modules (`experiments.flute_synthetic`, `experiments.adaptpfl_synthetic`, the
settings of their scripts' defaults but the grid), on one managed TFF runtime each."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable

from runner.report import Column, Panel, Series, Table, as_float, read_csv
from runner.running import Context, Result, mean_of, mean_std

# ------------------------------------------------------------------------------------------------
# 6. flute_synthetic, 7. adaptpfl_synthetic


FLUTE_SCALES = {
    "small": dict(ks="2,4", num_clients="30", seeds=1),
    "full": dict(ks="2,4,6,8", num_clients="15,30", seeds=3),
}
FLUTE_NAMES = {"flute": "FLUTE", "fedrep_ri": "FedRep(RI)", "fedrep_mom": "FedRep (MoM init)"}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _seed_list(ctx: Context, count: int) -> str:
    return ",".join(str(ctx.seed + s) for s in range(count))


def _over_seeds(ctx: Context, count: int) -> str:
    return (f"mean ± std over seeds {_seed_list(ctx, count)}" if count > 1
            else f"seed {ctx.seed}")


def _run_grid(out: pathlib.Path, config: dict, settings: Iterable[tuple],
              run_setting: Callable[..., list[dict]],
              write_results: Callable[[list[dict], dict], str]) -> None:
    """Runs `run_setting(*setting, config)` for each setting on one managed TFF runtime
    (its worker log in `out`) and writes results.csv and results.md to `out`."""
    from tffl import runtime

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with runtime.local_runtime(log_dir=out):
        for setting in settings:
            rows += run_setting(*setting, config)
    write_results(rows, config)


def run_flute_synthetic(ctx: Context) -> Result:
    from experiments import flute_synthetic

    cfg = FLUTE_SCALES[ctx.scale]
    out = ctx.output_dir / "flute_synthetic"
    if not (ctx.resume and (out / "results.csv").exists()):
        config = dict(flute_synthetic.DEFAULTS, ks=_ints(cfg["ks"]),
                      num_clients=_ints(cfg["num_clients"]),
                      seeds=_ints(_seed_list(ctx, cfg["seeds"])), output_dir=out)
        _run_grid(out, config, [(m, k, seed) for m in config["num_clients"]
                                for k in config["ks"] for seed in config["seeds"]],
                  flute_synthetic.run_setting, flute_synthetic.write_results)
    results = read_csv(out / "results.csv")
    error_keys = [k for k in results[0] if k.startswith("error_round_")]
    rounds = [int(k.rsplit("_", 1)[1]) for k in error_keys]
    rows, panels = [], []
    groups = list(dict.fromkeys((int(r["num_clients"]), int(r["k"])) for r in results))
    for m, k in groups:
        group = [r for r in results if (int(r["num_clients"]), int(r["k"])) == (m, k)]
        series = []
        for method, eta in dict.fromkeys((r["method"], r["learning_rate"]) for r in group):
            runs = [r for r in group if (r["method"], r["learning_rate"]) == (method, eta)]
            row = {"M": m, "k": k, "method": FLUTE_NAMES.get(method, method),
                   "eta": f"{as_float(eta):g}"}
            for key in error_keys:
                row[key] = mean_std([as_float(r[key]) for r in runs])
            rows.append(row)
            series.append(Series(f"{row['method']} η={row['eta']}", rounds,
                                 [mean_of([as_float(r[key]) for r in runs]) for key in error_keys]))
        floors = [as_float(r["floor"]) for r in group if r["method"] == group[0]["method"]]
        rows.append({"M": m, "k": k, "method": "rank-k optimum (noise-free floor)",
                     error_keys[-1]: mean_std(floors)})
        panels.append(Panel(f"M = {m}, k = {k}", "round", "(1/M) Σ ‖B w_i − φ_i‖", series,
                            hlines=[("rank-k floor", mean_of(floors))]))
    panels = panels[:4]  # the plot shows at most four settings; the table has them all
    columns = ([Column("M", "M"), Column("k", "k"), Column("method", "method"),
                Column("η", "eta")]
               + [Column(f"round {t}" if key != error_keys[-1] else f"final (round {t})", key)
                  for t, key in zip(rounds, error_keys)])
    title = (
        "FLUTE vs FedRep on FLUTE's under-parameterized linear task (flute.md §5, App. C.1; "
        "scripts/flute_synthetic.py defaults: d = 10, N = 20 samples per client, noise variance "
        f"0.3, γ1 = 0.25, γ2 = 0.125, η = 0.03, 200 rounds, all clients every round); error "
        f"(1/M) Σ_i ‖B w_i − φ_i‖, {_over_seeds(ctx, cfg['seeds'])}.")
    notes = ["Paper (flute.md §5.3; Figures 1 and 3 are curves, no numbers): FLUTE beats "
             "FedRep(RI) in far fewer iterations; with d, M, N fixed, increasing k shrinks the "
             "gap in convergence speed between FLUTE and FedRep; with d, k, N fixed, increasing "
             "M lowers FLUTE's average error."]
    return Result(Table(title, columns, rows, notes), panels, "FLUTE vs FedRep")


ADAPTPFL_SCALES = {
    "small": dict(num_samples="20,40", alphas="0.3,0.5", seeds=1),
    "full": dict(num_samples="20,40", alphas="0.1,0.3,0.5", seeds=3),
}
ADAPTPFL_NAMES = {"fedrep": "FedRep (exact heads, QR)", "fedrep_gd": "FedRep (gradient heads)",
                  "adaptpfl": "AdaptPFL", "local": "local least squares (reference)"}


def run_adaptpfl_synthetic(ctx: Context) -> Result:
    from experiments import adaptpfl_synthetic

    cfg = ADAPTPFL_SCALES[ctx.scale]
    out = ctx.output_dir / "adaptpfl_synthetic"
    if not (ctx.resume and (out / "results.csv").exists()):
        config = dict(adaptpfl_synthetic.DEFAULTS, num_samples=_ints(cfg["num_samples"]),
                      alphas=[float(a) for a in cfg["alphas"].split(",")],
                      seeds=_ints(_seed_list(ctx, cfg["seeds"])), output_dir=out)
        _run_grid(out, config, [(m, seed) for m in config["num_samples"]
                                for seed in config["seeds"]],
                  adaptpfl_synthetic.run_setting, adaptpfl_synthetic.write_results)
    results = read_csv(out / "results.csv")
    rows = []
    sizes = list(dict.fromkeys(int(r["num_samples"]) for r in results))
    keys = list(dict.fromkeys((r["method"], r["alpha"]) for r in results))
    for m in sizes:
        for method, alpha in keys:
            runs = [r for r in results if int(r["num_samples"]) == m
                    and (r["method"], r["alpha"]) == (method, alpha)]
            if not runs:
                continue
            rows.append({
                "m": m, "method": ADAPTPFL_NAMES.get(method, method),
                "alpha": f"{as_float(alpha):g}" if alpha else ("0" if method == "fedrep_gd"
                                                              else None),
                "personalized_error": mean_std([as_float(r["personalized_error"]) for r in runs]),
                "subspace_distance": mean_std([as_float(r["subspace_distance"]) for r in runs]),
                "_error": mean_of([as_float(r["personalized_error"]) for r in runs]),
            })
    labels = list(dict.fromkeys((r["method"], r["alpha"]) for r in rows))
    panels = [Panel("personalized error after 100 rounds", "samples per client m",
                    "(1/N) Σ ‖θ_i − θ_i*‖",
                    [Series(f"{method}" + (f" α={alpha}" if alpha and alpha != "0" else ""), [],
                            [next((r["_error"] for r in rows if r["m"] == m
                                   and (r["method"], r["alpha"]) == (method, alpha)), None)
                             for m in sizes])
                     for method, alpha in labels],
                    kind="bar", categories=[f"m = {m}" for m in sizes], logy=True,
                    hlines=[("FedRep floor ≈ α*‖s*‖ = 0.3", 0.3)])]
    columns = [Column("m", "m"), Column("method", "method"), Column("α", "alpha"),
               Column("personalized error", "personalized_error"),
               Column("dist(B, B*)", "subspace_distance")]
    title = (
        "AdaptPFL vs FedRep on clients with a personal shortcut component (adaptpfl.md §2.7; "
        "scripts/adaptpfl_synthetic.py defaults: N = 50 clients, d = 20, k = 2, data α* = 0.3, "
        "‖s_i*‖ = 1, noise σ = 0.1, η = 0.1, τ_w = τ_s = 10, τ_b = 1, 100 rounds, B⁰ by the "
        "method of moments, all clients every round); personalized error (1/N) Σ_i ‖θ_i − "
        f"θ_i*‖, {_over_seeds(ctx, cfg['seeds'])}.")
    notes = ["FedRep's model θ_i = B w_i cannot express the shortcut part; its error floor is "
             "about α*‖s_i*‖ = 0.3 per client. The AdaptPFL draft has no experiments to compare "
             "with (adaptpfl.md §5)."]
    for r in rows:
        r.pop("_error")
    return Result(Table(title, columns, rows, notes), panels, "AdaptPFL vs FedRep")
