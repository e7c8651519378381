r"""Linear FLUTE against FedRep on FLUTE's under-parameterized synthetic task (App. C.1, Figure 3).

Task (`tasks.synthetic.flute_linear`, flute.md §5.1): d = 10, M clients, N samples per client
(N is *samples per client* here, as in the paper's Sections 3–5 and App. C.1), Φ = U Λ Vᵀ with
λ_i = 2d̲/(i+1) (rank Φ = min(d, M) = 10 > k: under-parameterized), x ~ N(0, I_d),
y = φ_iᵀx + ξ with ξ ~ N(0, 0.3). Each client keeps its fixed dataset and uses all of it every
round; all M clients take part every round.

Methods (every one sees the same data; per seed a new Φ, data and initialization):
  flute        `tffl.algorithms.flute_linear` (Algorithm 1), η_l = η_r = --learning_rate, γ1, γ2, random init
               N(0, α²), α = 1/(10d).
  fedrep_ri    `tffl.algorithms.fedrep_linear` (FedRep as flute.md §5.4 defines it: exact least-squares heads,
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
Every run is `tffl.simulation.driver.run_rounds` (all clients every round; the error is its evaluation at
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

import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from runner import cli  # noqa: E402
from runner import tensorflow_import  # noqa: E402
from runner.cli import UsageError  # noqa: E402

# TensorFlow, TFF and tffl are imported (by `cli.run_settings`) after the flags are checked, so
# that a bad flag is reported in a second; `tffl.runtime` (whose exit hook stops any TFF worker)
# is imported before any worker is started.

from experiments.flute_synthetic import DEFAULTS, METHODS, run_setting, write_results  # noqa: E402


def _text(values) -> str:
    return ",".join(map(str, values))


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a
    FlagValues of its own in a test), registered for this module: run as a script, absl's
    --helpshort lists them."""
    d = cli.definer(flag_values)
    d.DEFINE_list("ks", _text(DEFAULTS["ks"]), "Representation widths k (each in [1, dim]).")
    d.DEFINE_list("num_clients", _text(DEFAULTS["num_clients"]), "Numbers of clients M.")
    d.DEFINE_integer(
        "num_samples", DEFAULTS["num_samples"], "N, samples per client (fixed dataset).")
    d.DEFINE_integer("dim", DEFAULTS["dim"], "d, the feature dimension.")
    d.DEFINE_float(
        "noise_variance", DEFAULTS["noise_variance"], "Variance of the label noise ξ.")
    d.DEFINE_float(
        "learning_rate", DEFAULTS["learning_rate"], "FLUTE's η_l = η_r (paper: 0.03).")
    d.DEFINE_float("gamma1", DEFAULTS["gamma1"], "FLUTE's γ1 (theory: 1/4).")
    d.DEFINE_float("gamma2", DEFAULTS["gamma2"], "FLUTE's γ2 (theory: 1/8).")
    d.DEFINE_list(
        "fedrep_learning_rates", _text(DEFAULTS["fedrep_learning_rates"]),
        "FedRep(RI) step sizes η (one run each; 0.03 is the paper's η; FedRep averages the "
        "clients' B-steps where FLUTE sums them, so its step is effectively M times smaller at "
        "equal η).")
    d.DEFINE_list(
        "methods", _text(DEFAULTS["methods"]), "Methods: " + ", ".join(METHODS) + ".")
    d.DEFINE_integer("rounds", DEFAULTS["rounds"], "Communication rounds per run.")
    d.DEFINE_list("report_rounds", _text(DEFAULTS["report_rounds"]),
                  "Rounds (< --rounds) whose error is also reported.")
    d.DEFINE_list(
        "seeds", _text(DEFAULTS["seeds"]), "Seeds (each: new Φ, data and initialization).")
    d.DEFINE_string("output_dir", "runs/flute_synthetic",
                    "Where results.csv, results.md and the worker log go.")


def _int_list(fv: flags.FlagValues, name: str, minimum: int, maximum: int | None = None
              ) -> list[int]:
    text = fv[name].value
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


def _validate_flags(fv: flags.FlagValues) -> dict:
    """Checks the flags together; returns the parsed lists and the (writable) output dir."""
    for name in ("num_samples", "dim", "rounds"):
        if fv[name].value < 1:
            raise UsageError(f"flag --{name}={fv[name].value}: must be >= 1")
    config = dict(
        ks=_int_list(fv, "ks", 1, fv.dim),
        num_clients=_int_list(fv, "num_clients", 1),
        report_rounds=sorted(_int_list(fv, "report_rounds", 1, fv.rounds - 1))
        if fv.report_rounds else [],
        seeds=_int_list(fv, "seeds", 0),
    )
    if not (np.isfinite(fv.learning_rate) and fv.learning_rate > 0):
        raise UsageError(f"flag --learning_rate={fv.learning_rate}: must be > 0")
    for name in ("gamma1", "gamma2", "noise_variance"):
        value = fv[name].value
        if not (np.isfinite(value) and value >= 0):
            raise UsageError(f"flag --{name}={value}: must be >= 0")
    try:
        rates = [float(v) for v in fv.fedrep_learning_rates]
    except ValueError:
        rates = [-1.0]
    if not rates or any(not (np.isfinite(r) and r > 0) for r in rates):
        raise UsageError(f"flag --fedrep_learning_rates={','.join(fv.fedrep_learning_rates)}: "
                         "must be numbers > 0")
    config["fedrep_learning_rates"] = rates
    unknown = [m for m in fv.methods if m not in METHODS]
    if unknown or not fv.methods:
        raise UsageError(f"flag --methods={','.join(fv.methods)}: unknown "
                         f"{', '.join(unknown) or 'empty'}; choose from {', '.join(METHODS)}")
    config["methods"] = [m for m in METHODS if m in fv.methods]
    output_dir = cli.writable_output_dir(fv.output_dir)
    config["output_dir"] = output_dir
    config.update(dim=fv.dim, num_samples=fv.num_samples,
                  noise_variance=fv.noise_variance, learning_rate=fv.learning_rate,
                  gamma1=fv.gamma1, gamma2=fv.gamma2, rounds=fv.rounds)
    return config


def main(argv: list[str]) -> int:
    def settings(config):
        for m in config["num_clients"]:
            for k in config["ks"]:
                for seed in config["seeds"]:
                    yield run_setting(m, k, seed, config)

    return cli.run_settings("flute_synthetic.py", argv, lambda: _validate_flags(flags.FLAGS),
                            settings, write_results)


def parse(argv: list[str], flag_values: flags.FlagValues) -> dict:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks the values
    together, creating the output folder; returns the config. A bad flag is one line on stderr and
    `SystemExit(2)`, as on the command line; nothing heavy is imported."""
    return cli.parse_checked("flute_synthetic.py", argv, flag_values, __doc__, _validate_flags)


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))
