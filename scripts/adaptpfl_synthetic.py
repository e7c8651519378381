r"""Linear AdaptPFL against FedRep on clients with a personal shortcut component.

Task (`tasks.synthetic.adaptpfl_linear`, adaptpfl.md §2.7): d = 20, k = 2, N clients with m
fixed samples each, θ_i* = (1 − α*) B* w_i* + α* s_i* with B* orthonormal, ‖w_i*‖ = √k, s_i* ⊥
span(B*), ‖s_i*‖ = C_s, x ~ N(0, I_d), y = xᵀθ_i* + z, z ~ N(0, σ²). No rank-k model fits every
client: FedRep's θ_i = B w_i misses each client's shortcut part α*‖s_i*‖ (= 0.3 by default).
All clients take part every round; every method starts from the same B⁰ (FedRep's method of
moments on the clients' data, or a random orthonormal B with --init=random).

Methods:
  fedrep        `tffl.algorithms.fedrep_linear`: exact least-squares heads, one step on B, mean, QR (the same
                FedRep as the FLUTE comparison in scripts/flute_synthetic.py).
  fedrep_gd     FedRep with gradient heads = `tffl.algorithms.adaptpfl_linear` at α = 0: τ_w head steps,
                τ_b steps on B, mean of B (the exact α = 0 case of AdaptPFL, same schedule).
  adaptpfl      `tffl.algorithms.adaptpfl_linear` at each --alphas value: τ_w head, τ_s shortcut, τ_b
                representation steps; only B is averaged.
  local         reference, not federated: each client's own least squares (minimum norm).
Personalized error: (1/N) Σ_i ‖θ_i − θ_i*‖ (the population excess risk of client i is
‖θ_i − θ_i*‖², x being isotropic), after --rounds; also dist(B, B*), the principal-angle distance.
Mean ± std over --seeds.

    .venv/bin/python scripts/adaptpfl_synthetic.py --output_dir=runs/adaptpfl_synthetic
    .venv/bin/python scripts/adaptpfl_synthetic.py --num_samples=10,20,40 --alphas=0.1,0.3,0.5

Writes results.csv (one row per run) and results.md (the printed table) to --output_dir. Every
federated run is `tffl.simulation.driver.run_rounds` (all clients every round; the error and dist(B, B*)
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

import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from runner import cli  # noqa: E402
from runner import tensorflow_import  # noqa: E402
from runner.cli import UsageError  # noqa: E402

# TensorFlow, TFF and tffl are imported (by `cli.run_settings`) after the flags are checked, so
# that a bad flag is reported in a second; `tffl.runtime` (whose exit hook stops any TFF worker)
# is imported before any worker is started.

from experiments.adaptpfl_synthetic import DEFAULTS, METHODS, run_setting, write_results  # noqa: E402


def _text(values) -> str:
    return ",".join(map(str, values))


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a
    FlagValues of its own in a test), registered for this module: run as a script, absl's
    --helpshort lists them."""
    d = cli.definer(flag_values)
    d.DEFINE_integer("num_clients", DEFAULTS["num_clients"], "N, the number of clients.")
    d.DEFINE_list("num_samples", _text(DEFAULTS["num_samples"]), "m, samples per client (one "
                  "table block each; fixed local datasets).")
    d.DEFINE_integer("dim", DEFAULTS["dim"], "d, the feature dimension.")
    d.DEFINE_integer("rank", DEFAULTS["rank"], "k, the representation width (1 <= k < d).")
    d.DEFINE_float("data_alpha", DEFAULTS["data_alpha"], "α* of the data model, in [0, 1].")
    d.DEFINE_float("shortcut_norm", DEFAULTS["shortcut_norm"], "C_s = ‖s_i*‖ (>= 0).")
    d.DEFINE_boolean("orthogonal_to_heads", DEFAULTS["orthogonal_to_heads"],
                     "Draw shortcuts with Σ_i s_i* w_i*ᵀ = 0 (adaptpfl.md §2.6).")
    d.DEFINE_float("noise_std", DEFAULTS["noise_std"], "σ of the label noise (>= 0).")
    d.DEFINE_list("alphas", _text(DEFAULTS["alphas"]), "AdaptPFL's α values, each in (0, 1].")
    d.DEFINE_float("learning_rate", DEFAULTS["learning_rate"],
                   "η for every method (head, shortcut and B steps; FedRep's B).")
    d.DEFINE_integer("head_steps", DEFAULTS["head_steps"], "τ_w, head steps per round.")
    d.DEFINE_integer("shortcut_steps", DEFAULTS["shortcut_steps"],
                     "τ_s, shortcut steps per round.")
    d.DEFINE_integer("representation_steps", DEFAULTS["representation_steps"],
                     "τ_b, local steps on B per round.")
    d.DEFINE_float("shortcut_ridge", DEFAULTS["shortcut_ridge"],
                   "β >= 0, ridge on the shortcut.")
    d.DEFINE_enum(
        "adaptpfl_variant", DEFAULTS["adaptpfl_variant"], ["a", "b"], "AdaptPFL's variant: a "
        "(Algorithm 1 repaired: tau gradient steps on head, shortcut and B) or b (the draft's "
        "analysed iteration (2)-(8): ridge shortcut and least-squares head solved exactly, one B "
        "step then QR; adaptpfl.md 1.5).")
    d.DEFINE_boolean("project_shortcut", DEFAULTS["project_shortcut"],
                     "Variant b: project s onto span(B)'s orthogonal complement, (3).")
    d.DEFINE_float("shortcut_damping", DEFAULTS["shortcut_damping"],
                   "Variant b: lambda_S in (0, 1], (4).")
    d.DEFINE_float("head_damping", DEFAULTS["head_damping"], "Variant b: lambda_W in (0, 1], (6).")
    d.DEFINE_enum("adaptpfl_order", DEFAULTS["adaptpfl_order"], ["sw", "ws"],
                  "Variant b: shortcut then head (sw, the analysis) or head first (ws).")
    d.DEFINE_enum("init", DEFAULTS["init"], ["moments", "random"],
                  "B⁰: FedRep's method of moments, or a random orthonormal matrix.")
    d.DEFINE_list("methods", _text(DEFAULTS["methods"]), "Methods: " + ", ".join(METHODS) + ".")
    d.DEFINE_integer("rounds", DEFAULTS["rounds"], "Communication rounds per run.")
    d.DEFINE_list("seeds", _text(DEFAULTS["seeds"]),
                  "Seeds (each: new ground truth, data and B⁰).")
    d.DEFINE_string("output_dir", "runs/adaptpfl_synthetic",
                    "Where results.csv, results.md and the worker log go.")


def _list(fv: flags.FlagValues, name: str, kind, ok, requirement: str) -> list:
    text = fv[name].value
    try:
        values = [kind(v) for v in text]
    except ValueError:
        values = None
    if not values or not all(ok(v) for v in values):
        raise UsageError(f"flag --{name}={','.join(text)}: {requirement}")
    if len(set(values)) != len(values):
        raise UsageError(f"flag --{name}={','.join(text)}: values repeat")
    return values


def _validate_flags(fv: flags.FlagValues) -> dict:
    """Checks the flags together; returns the parsed lists and the (writable) output dir."""
    for name in ("num_clients", "dim", "rounds"):
        if fv[name].value < 1:
            raise UsageError(f"flag --{name}={fv[name].value}: must be >= 1")
    if not 1 <= fv.rank < fv.dim:
        raise UsageError(f"flag --rank={fv.rank}: must be in [1, --dim={fv.dim})")
    for name in ("head_steps", "shortcut_steps", "representation_steps"):
        if fv[name].value < 0:
            raise UsageError(f"flag --{name}={fv[name].value}: must be >= 0")
    if not (np.isfinite(fv.learning_rate) and fv.learning_rate > 0):
        raise UsageError(f"flag --learning_rate={fv.learning_rate}: must be > 0")
    for name in ("shortcut_norm", "noise_std", "shortcut_ridge"):
        value = fv[name].value
        if not (np.isfinite(value) and value >= 0):
            raise UsageError(f"flag --{name}={value}: must be >= 0")
    for name in ("shortcut_damping", "head_damping"):
        value = fv[name].value
        if not (np.isfinite(value) and 0.0 < value <= 1.0):
            raise UsageError(f"flag --{name}={value}: must be in (0, 1]")
    if not 0.0 <= fv.data_alpha <= 1.0:
        raise UsageError(f"flag --data_alpha={fv.data_alpha}: must be in [0, 1]")
    if fv.orthogonal_to_heads and fv.num_clients <= fv.rank:
        raise UsageError(f"flag --orthogonal_to_heads needs --num_clients > --rank "
                         f"({fv.num_clients} <= {fv.rank})")
    config = dict(
        num_samples=_list(fv, "num_samples", int, lambda v: v >= 1, "must be integers >= 1"),
        alphas=_list(fv, "alphas", float, lambda v: 0.0 < v <= 1.0,
                     "must be numbers in (0, 1] (α = 0 is the fedrep_gd method)"),
        seeds=_list(fv, "seeds", int, lambda v: v >= 0, "must be integers >= 0"),
    )
    if fv.adaptpfl_variant == "b" and any(a >= 1.0 for a in config["alphas"]):
        raise UsageError(f"flag --alphas={','.join(fv.alphas)}: --adaptpfl_variant=b solves "
                         "the head with a 1/(1-alpha) factor; every alpha must be < 1")
    unknown = [m for m in fv.methods if m not in METHODS]
    if unknown or not fv.methods:
        raise UsageError(f"flag --methods={','.join(fv.methods)}: unknown "
                         f"{', '.join(unknown) or 'empty'}; choose from {', '.join(METHODS)}")
    config["methods"] = [m for m in METHODS if m in fv.methods]
    output_dir = cli.writable_output_dir(fv.output_dir)
    config["output_dir"] = output_dir
    config.update({name: fv[name].value for name in (
        "adaptpfl_order", "adaptpfl_variant", "data_alpha", "dim", "head_damping",
        "head_steps", "init", "learning_rate", "noise_std", "num_clients",
        "orthogonal_to_heads", "project_shortcut", "rank", "representation_steps", "rounds",
        "shortcut_damping", "shortcut_norm", "shortcut_ridge", "shortcut_steps")})
    return config


def main(argv: list[str]) -> int:
    def settings(config):
        for m in config["num_samples"]:
            for seed in config["seeds"]:
                yield run_setting(m, seed, config)

    return cli.run_settings("adaptpfl_synthetic.py", argv, lambda: _validate_flags(flags.FLAGS),
                            settings, write_results)


def parse(argv: list[str], flag_values: flags.FlagValues) -> dict:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks the values
    together, creating the output folder; returns the config. A bad flag is one line on stderr and
    `SystemExit(2)`, as on the command line; nothing heavy is imported."""
    return cli.parse_checked("adaptpfl_synthetic.py", argv, flag_values, __doc__, _validate_flags)


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))
