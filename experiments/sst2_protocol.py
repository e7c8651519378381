"""The SST-2 protocol of the RoLoRA claim experiments (`experiments.sst2`): its
settings, one `RunConfig` per (method, N, seed, learning rate) run (`sst2_claim_config`), the run
order and learning-rate grids (`Protocol`, `run_protocol`) and each (method, N) cell's row.

The runs go through `archive.train_once` and `runner.running.run_training`; with
--collect they are only read, under --estimate a probe stands in for each N's first run."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runner import archive
from runner.estimate import Probe, active_probes, estimate_progress
from runner.report import as_float, missing, read_csv
from runner.run_config import RunConfig
from runner.running import METHOD_NAMES, Context, mean_of, mean_std, run_training

# rolora.md §3.2, NeurIPS Table 1 (= ICML Tables 1 and 6): SST-2 accuracy (%), RoBERTa-Large,
# rank 4 on W_q, W_v of layers 18-23, 500 rounds for 3 clients scaled as 3/N, mean ± std.
SST2_PAPER = {
    (3, "fedavg_lora"): "95.62 ± 0.17", (3, "ffa_lora"): "95.18 ± 0.09",
    (3, "flexlora"): "94.91 ± 0.18", (3, "rolora"): "95.49 ± 0.16",
    (20, "fedavg_lora"): "94.3 ± 0.27", (20, "ffa_lora"): "93.88 ± 0.06",
    (20, "flexlora"): "90.97 ± 1.78", (20, "rolora"): "94.88 ± 0.18",
    (50, "fedavg_lora"): "93.00 ± 0.35", (50, "ffa_lora"): "93.23 ± 0.12",
    (50, "flexlora"): "54.08 ± 5.5", (50, "rolora"): "94.80 ± 0.17",
}


def sst2_rounds(rounds_3: int, num_clients: int) -> int:
    """R_N = max(1, ⌊R_3·3/N + ½⌋): the same total samples as R_3 rounds of 3 clients."""
    return max(1, math.floor(rounds_3 * 3 / num_clients + 0.5))



# 9-10. sst2_clients and sst2_dirichlet, and 13-14.
# sst2_clients_mean and sst2_dirichlet_mean (their decisive cells, corrected classifier)


# RoLoRA's protocol (rolora.md §3.1): the same local steps per client per round for every N,
# R_N = R_3·3/N (a constant total sample count), full participation; each method's learning rate
# chosen on the dev set from a grid (at the first seed and the smallest N), accuracy reported on
# the labeled test split; `seeds` seeds per cell.
SST2_CLAIM_METHODS = {
    "rolora": dict(algorithm="rolora"),
    "fedavg_lora": dict(algorithm="fedavg_lora"),
    "ffa_lora": dict(algorithm="ffa_lora"),
    "flexlora": dict(algorithm="flexlora"),
    "flora": dict(algorithm="flora"),
    "fedsa_lora": dict(algorithm="fedsa_lora"),
    "rolora_ffa": dict(algorithm="rolora_ffa", rolora_fraction=0.2),
}
SST2_CLAIM_ALL = (*SST2_CLAIM_METHODS, "centralized")  # --methods' names
SST2_CLAIM_NAMES = {**METHOD_NAMES, "flora": "FLoRA", "fedsa_lora": "FedSA-LoRA",
                    "rolora_ffa": "20% RoLoRA + 80% FFA-LoRA", "centralized": "centralized LoRA"}
# sst2_clients and sst2_dirichlet: the frozen-pooler protocol. Their archived runs
# (docs/runs/sst2_clients-full, docs/runs/sst2_dirichlet-full) classified tanh(pooler(h_[CLS]))
# with BERT's pooler frozen and never trained (for MiniLM a random projection), on sentences cut
# at 32 tokens. Their configurations set pooling="pooler", sequence_length=32 explicitly; now
# `--pooling=pooler` trains the pooler, so a rerun is not the archived protocol (the
# archives are what they are).
SST2_CLAIM_SCALES = {
    "small": dict(backbone="tiny", pooling="pooler", sequence_length=32, rounds_3=6,
                  local_steps=5, batch_size=16, learning_rates=(0.5,), seeds=1, clients=(3, 20)),
    "full": dict(backbone="minilm", pooling="pooler", sequence_length=32, lora_layers="3,4,5",
                 rounds_3=500, local_steps=10, batch_size=16, learning_rates=(0.1, 0.3, 1.0),
                 seeds=3, clients=(3, 20, 50), grid_every_n=True, edge_rates=(0.03, 3.0)),
}
# sst2_clients_mean and sst2_dirichlet_mean: the cells the claims rest on,
# rerun with the corrected classifier: mean pooling (MiniLM's own), a linear head, whole sentences
# (no sequence_length: the default is the longest tokenized example). A scale's
# `methods` are the methods the experiment has (default: all of SST2_CLAIM_METHODS) and
# `method_clients` a method's own client counts (default: the experiment's): FlexLoRA runs only
# at the largest N, where its collapse is claimed.
SST2_MEAN_METHODS = ("rolora", "fedavg_lora", "ffa_lora", "flexlora")
SST2_DIRICHLET_MEAN_METHODS = ("rolora", "fedavg_lora")
# Their rates are chosen on the mean dev accuracy of the last two evaluations
# (`select_on="last_two"`), and a cell whose choice is thin (`thin_choice`) runs its runner-up at
# every seed too (`runner_up=True`), so that each verdict is also read under the runner-up.
SST2_MEAN_SCALES = {
    "small": dict(SST2_CLAIM_SCALES["small"], pooling="mean", head="linear",
                  sequence_length=None, methods=SST2_MEAN_METHODS,
                  method_clients={"flexlora": (20,)}, select_on="last_two", runner_up=True),
    "full": dict(backbone="minilm", pooling="mean", head="linear", sequence_length=None,
                 lora_layers="3,4,5", rounds_3=500, local_steps=10, batch_size=16,
                 learning_rates=(0.1, 0.3, 1.0), edge_rates=(0.01, 0.03, 3.0, 10.0), seeds=3,
                 clients=(3, 50), grid_every_n=True, methods=SST2_MEAN_METHODS,
                 method_clients={"flexlora": (50,)}, select_on="last_two", runner_up=True),
}
# SST-2's dev split: a choice won by at most THIN_SENTENCES of its sentences is thin.
SST2_DEV_SENTENCES = 872
THIN_SENTENCES = 4
# metrics.csv's FedAvg-LoRA averaging-error column ends in this (finalizer/averaging_error).
AVERAGING_ERROR = "averaging_error"


@dataclasses.dataclass(frozen=True)
class Sst2Run:
    """One training run of the SST-2 protocol and where it goes."""

    method: str
    clients: int
    seed: int
    learning_rate: float
    rounds: int
    run_dir: pathlib.Path


def _classifier_fields(cfg: dict) -> dict:
    """pooling, head and sequence_length as the scale sets them (None: the default; for
    sequence_length, whole sentences)."""
    return {name: cfg[name] for name in ("pooling", "head", "sequence_length")
            if cfg.get(name) is not None}


def sst2_claim_config(cfg: dict, run: Sst2Run, partition: Mapping[str, Any],
                      data_dir) -> RunConfig:
    """The training run `run` of the SST-2 protocol at scale `cfg` on the clients `partition`
    (e.g. {"partition": "iid"}) cuts; the centralized run is FedAvg-LoRA on one client."""
    method = (SST2_CLAIM_METHODS["fedavg_lora"] if run.method == "centralized"
              else SST2_CLAIM_METHODS[run.method])
    layers = dict(lora_layers=cfg["lora_layers"]) if cfg.get("lora_layers") else {}
    return RunConfig().with_changes(
        task="sst2", eval_test=True, backbone=cfg["backbone"], **_classifier_fields(cfg),
        rank=4, lora_targets=("query", "value"), **layers, **method, **partition,
        num_clients=run.clients, clients_per_round=run.clients, rounds=run.rounds,
        local_steps=cfg["local_steps"], batch_size=cfg["batch_size"],
        learning_rate=run.learning_rate, eval_every=max(1, run.rounds // 5), seed=run.seed,
        data_dir=str(data_dir), output_dir=str(run.run_dir))


def run_finished(run: Sst2Run) -> dict | None:
    """The run's summary.json if it completed all its rounds."""
    return archive.finished_summary(run.run_dir, run.rounds)


def _claim_name(final: dict, key: str) -> str:
    if "eval_personal_accuracy" in final:
        return {"eval_accuracy": "eval_personal_accuracy",
                "eval_test_accuracy": "eval_personal_test_accuracy"}[key]
    return key


def claim_accuracy(summary: dict, key: str) -> float | None:
    """Final `key` accuracy: eval_test_accuracy / eval_accuracy of the global model, or for
    FedSA-LoRA (personal B factors) the personalized accuracy on the clients' shards of the
    test / dev split. A figure the run's final lacks (FedSA-LoRA's test figure, for a run from
    before the test split was cut per client) comes from a rerun of the run recorded in its
    summary (`archive.attach_rerun`), else it is None."""
    final = summary["final"]
    name = _claim_name(final, key)
    if name in final:
        return final[name]
    return summary.get(archive.RERUN, {}).get("final", {}).get(name)


def rerun_note(summary: dict, key: str) -> str | None:
    """How the run and its rerun compare, when the `key` figure came from the rerun."""
    final, rerun = summary["final"], summary.get(archive.RERUN, {}).get("final", {})
    name, dev = _claim_name(final, key), _claim_name(final, "eval_accuracy")
    if name in final or name not in rerun:
        return None
    return f"dev {final[dev]:.4f} → {rerun[dev]:.4f}" if dev in final and dev in rerun else ""


def final_correct(run_dir: pathlib.Path, last_round: int) -> dict[str, np.ndarray] | None:
    """{split: per-example correctness} of the run's evaluation after its last round
    (`tffl.simulation.predictions`: "eval" the dev split, "test" the labeled test split), or
    None for a run that kept no predictions of that round."""
    from tffl.simulation.predictions import read_predictions

    rounds, labels = read_predictions(run_dir)
    last = rounds.get(last_round)
    if last is None:
        return None
    return {split: predicted == labels[split] for split, predicted in last.items()}


def selection_score(run_dir: pathlib.Path, summary: dict, select_on: str = "final") -> float:
    """What a grid run is chosen by: its final dev accuracy (`select_on="final"`), or with
    "last_two" the mean of its last two evaluations' (metrics.csv; the final alone where the run
    evaluated once, or kept no metrics). A personalized run's measure is its personalized one.

    >>> run = run_dir / "selection_example"; run.mkdir()
    >>> _ = (run / "metrics.csv").write_text("round,eval_accuracy\\n2,0.80\\n3,\\n4,0.83\\n")
    >>> round(selection_score(run, {"final": {"eval_accuracy": 0.83}}, "last_two"), 6)
    0.815
    """
    final = claim_accuracy(summary, "eval_accuracy")
    path = pathlib.Path(run_dir) / "metrics.csv"
    if select_on != "last_two" or not path.exists():
        return final
    name = _claim_name(summary["final"], "eval_accuracy")
    values = [v for v in (as_float(row.get(name)) for row in read_csv(path))
              if not math.isnan(v)]
    return mean_of(values[-2:]) if values else final


def thin_choice(grid: Mapping[float, float], sentences: int = SST2_DEV_SENTENCES) -> str | None:
    """Why a grid's choice (its best score, the smallest rate of equals) is thin, or None: a
    tie, a win by at most THIN_SENTENCES dev sentences, or the best rate at an edge of the
    rates tried.

    >>> thin_choice({0.1: 0.80, 0.3: 0.8429, 1.0: 0.8429})
    'a tie with lr 1'
    >>> thin_choice({0.1: 0.8165, 0.3: 0.8205, 1.0: 0.5092})
    'won by 3.5 dev sentences over lr 0.1'
    >>> thin_choice({0.1: 0.80, 0.3: 0.84, 1.0: 0.85}), thin_choice({0.1: 0.8, 0.3: 0.84, 1: 0.5})
    ('at the edge of the rates tried', None)
    """
    if len(grid) < 2:
        return None
    rates = sorted(grid)
    best = max(rates, key=grid.get)
    runner = max((r for r in rates if r != best), key=grid.get)
    margin = (grid[best] - grid[runner]) * sentences
    if margin <= 1e-9:
        return f"a tie with lr {runner:g}"
    if margin <= THIN_SENTENCES + 1e-9:
        return f"won by {margin:.1f} dev sentences over lr {runner:g}"
    if best in (rates[0], rates[-1]):
        return "at the edge of the rates tried"
    return None


def runner_up(grid: Mapping[float, float]) -> float | None:
    """The rate of the grid's second best score (None for a grid of one rate).

    >>> runner_up({0.1: 0.80, 0.3: 0.8429, 1.0: 0.8429}), runner_up({0.3: 0.8})
    (1.0, None)
    """
    rates = sorted(grid)
    if len(rates) < 2:
        return None
    best = max(rates, key=grid.get)
    return max((r for r in rates if r != best), key=grid.get)


def mean_averaging_error(metrics: Sequence[dict]) -> float | None:
    """The mean over a run's rounds of its metrics.csv column whose name ends in
    `averaging_error` (FedAvg-LoRA's ‖mean(A_i)·mean(B_i) − mean(A_i·B_i)‖_F /
    ‖mean(A_i·B_i) − A·B‖_F), over the rounds that have a value; None without such a column.

    >>> mean_averaging_error([{"round": "1", "train/averaging_error": "0.2"},
    ...                       {"round": "2", "train/averaging_error": ""},
    ...                       {"round": "3", "train/averaging_error": "0.4"}])
    0.30000000000000004
    >>> mean_averaging_error([{"round": "1"}]) is None
    True
    """
    names = [k for k in (metrics[0] if metrics else {}) if k.endswith(AVERAGING_ERROR)]
    values = [as_float(r[names[0]]) for r in metrics if names and not missing(r.get(names[0]))]
    return mean_of(values) if values else None


def _run_averaging_error(run_dir: pathlib.Path) -> float | None:
    path = run_dir / "metrics.csv"
    return mean_averaging_error(read_csv(path)) if path.exists() else None


class Protocol:
    """The runs of one SST-2 protocol experiment at scale `cfg`, in their order; each through
    `archive.train_once` (with --collect, only read), or under --estimate a probe."""

    def __init__(self, ctx: Context, cfg: dict, partition: Mapping[str, Any],
                 clients: Sequence[int], centralized: bool):
        self.ctx, self.cfg, self.partition, self.clients = ctx, cfg, dict(partition), clients
        self.seeds = [ctx.seed + s for s in range(cfg["seeds"])]
        own = cfg.get("methods", tuple(SST2_CLAIM_METHODS))
        self.methods = [m for m in [*SST2_CLAIM_METHODS, *(["centralized"] if centralized else [])]
                        if (m == "centralized" or m in own)
                        and (ctx.methods is None or m in ctx.methods)]
        self.probed: dict[tuple[bool, int], list[Probe]] = {}
        self.counted: set[pathlib.Path] = set()
        # chosen[(method, N)]: the best final dev accuracy of the grid at that N, or (without
        # cfg["grid_every_n"]) of the grid at the method's smallest N; None until its grid is
        # done. grids[(method, N)]: {rate: dev accuracy at the first seed, None if unfinished}.
        self.chosen: dict[tuple[str, int], float | None] = {}
        self.grids: dict[tuple[str, int], dict] = {}
        # runner_ups[(method, N)]: (the grid's second best rate, why the choice is thin), for
        # the cells whose choice is thin (`thin_choice`) under cfg["runner_up"].
        self.runner_ups: dict[tuple[str, int], tuple[float, str]] = {}

    def client_counts(self, method: str) -> list[int]:
        if method == "centralized":
            return [1]
        return sorted(self.cfg.get("method_clients", {}).get(method, self.clients))

    def run_of(self, method: str, n: int, seed: int, lr: float) -> Sst2Run:
        rounds = (self.cfg["rounds_3"] if method == "centralized"
                  else sst2_rounds(self.cfg["rounds_3"], n))
        return Sst2Run(method, n, seed, lr, rounds,
                       self.ctx.output_dir / method / f"N{n}" / f"seed{seed}" / f"lr{lr:g}")

    def execute(self, run: Sst2Run) -> dict | None:
        """The run's summary if it is finished (running it unless --collect), else None."""
        what = (f"training ({run.method}, N={run.clients}, seed {run.seed}, "
                f"lr {run.learning_rate:g})")
        config = sst2_claim_config(self.cfg, run, self.partition, self.ctx.data_dir)
        isolate = self.ctx.isolate
        probes = active_probes()
        if probes is not None:
            # --estimate: one probe per N (the first method's, and the centralized run's):
            # seeds and learning rates cost the same, and the methods differ only in what they
            # upload and in the server step. A run finished in the archive is read as an invocation
            # reads it (its grid's choice follows), and costs nothing.
            done, start_round = estimate_progress(run.run_dir, run.rounds)
            key = (run.method == "centralized", run.clients)
            if done is None and key not in self.probed:
                first = len(probes)
                run_training(config, what, isolate)
                self.probed[key] = [dataclasses.replace(p, start_round=0)
                                    for p in probes[first:]]
            elif run.run_dir not in self.counted:
                probes.extend([Probe(what, run.rounds, 0, 0.0, [], [], finished=True)]
                              if done is not None else
                              [dataclasses.replace(p, what=what, start_round=start_round)
                               for p in self.probed[key]])
            self.counted.add(run.run_dir)
            return done or {"final": {"eval_accuracy": 0.0, "eval_test_accuracy": 0.0},
                            "communication_rounds": 1, "upload_bytes_per_client_total": 0}
        return archive.train_once(
            run.run_dir, run.rounds,
            None if self.ctx.collect else lambda resume: run_training(
                config.with_changes(resume=resume), what, isolate),
            self.ctx.output_dir, self.ctx.archive_dir)

    def run_grid(self, method: str, n: int) -> float | None:
        """The grid's best rate by `selection_score` at the first seed (cfg["select_on"]; of
        equal scores, the smallest rate); a best rate at an edge of the grid brings in the
        nearest of cfg["edge_rates"] beyond that edge, until the best is inside or none is
        left. With cfg["runner_up"], a thin choice (`thin_choice`) records its runner-up."""
        rates, grid = sorted(self.cfg["learning_rates"]), {}
        while True:
            for lr in rates:
                if lr not in grid:
                    run = self.run_of(method, n, self.seeds[0], lr)
                    summary = self.execute(run)
                    grid[lr] = (None if summary is None else selection_score(
                        run.run_dir, summary, self.cfg.get("select_on", "final")))
            self.grids[(method, n)] = dict(sorted(grid.items()))
            if any(acc is None for acc in grid.values()):
                return None
            best = max(rates, key=grid.get)  # the first of equals: the smallest rate
            beyond = [r for r in self.cfg.get("edge_rates", ()) if
                      (best == rates[0] and r < best) or (best == rates[-1] and r > best)]
            if not beyond:
                why = thin_choice(grid)
                if self.cfg.get("runner_up") and why is not None:
                    self.runner_ups[(method, n)] = (runner_up(grid), why)
                return best
            rates = sorted([*rates, min(beyond, key=lambda r: abs(math.log(r / best)))])

    def run_all(self) -> None:
        """Runs (or finds) every run, in the order that leaves an experiment stopped part-way
        its most telling cells: per method (RoLoRA, FedAvg-LoRA, the centralized run, FFA-LoRA,
        ...), its learning-rate grid at the smallest N, then its first seed at every other N,
        largest first (its grid there, with cfg["grid_every_n"]); only then the other seeds,
        method by method; then the runner-ups of thin choices at the other seeds. (A grid's run
        at the chosen rate is that method's first seed at that N.) The centralized run comes
        right after FedAvg-LoRA, since the two decide whether the budget is large enough."""
        methods = self.methods

        def position(method):
            if method == "centralized" and "fedavg_lora" in methods:
                return methods.index("fedavg_lora") + 0.5
            return methods.index(method)

        run_order = sorted(methods, key=position)
        for method in run_order:
            first, *rest = self.client_counts(method)
            self.chosen[(method, first)] = self.run_grid(method, first)
            for n in sorted(rest, reverse=True):  # the largest N first: the claims are at N = 50
                if self.cfg.get("grid_every_n"):
                    self.chosen[(method, n)] = self.run_grid(method, n)
                else:
                    self.chosen[(method, n)] = self.chosen[(method, first)]
                    if self.chosen[(method, n)] is not None:
                        self.execute(self.run_of(method, n, self.seeds[0], self.chosen[method, n]))
        for method in run_order:
            for seed in self.seeds[1:]:
                for n in self.client_counts(method):
                    if self.chosen[(method, n)] is not None:
                        self.execute(self.run_of(method, n, seed, self.chosen[(method, n)]))
        for method in run_order:   # the thin choices' runner-ups, at every seed
            for n in self.client_counts(method):
                if (method, n) in self.runner_ups:
                    for seed in self.seeds[1:]:
                        self.execute(self.run_of(method, n, seed,
                                                 self.runner_ups[(method, n)][0]))

    def cell_row(self, method: str, n: int, paper: dict, lr: float | None = None) -> dict:
        """The table's row of one (method, N) cell at its chosen rate (or at `lr`, e.g. its
        runner-up), from its finished runs (all of them finished by `run_all`, or with
        --collect, not run)."""
        grid = self.grids.get((method, n))
        lr = self.chosen[(method, n)] if lr is None else lr
        tests, devs, uploads, errors, by_seed, reran, commits = [], [], [], [], {}, [], {}
        correct = {}
        for seed in self.seeds:
            run = self.run_of(method, n, seed, lr or 0)
            summary = self.execute(run) if lr is not None else None
            if summary is None:
                continue
            devs.append(claim_accuracy(summary, "eval_accuracy"))
            tests.append(claim_accuracy(summary, "eval_test_accuracy"))
            note = rerun_note(summary, "eval_test_accuracy")
            if note is not None:
                reran.append(f"{SST2_CLAIM_NAMES[method]}, N = {n}, seed {seed}"
                             + (f" ({note})" if note else ""))
            by_seed[seed] = (tests[-1], devs[-1], "eval_personal_accuracy" in summary["final"])
            commits[seed] = summary.get("provenance", {}).get("commit")
            correct[seed] = final_correct(run.run_dir, summary.get("rounds_completed", -1))
            comm = max(1, summary["communication_rounds"])
            uploads.append(summary["upload_bytes_per_client_total"] / comm / 1024)
            errors.append(_run_averaging_error(run.run_dir))
        tested = bool(tests) and None not in tests
        return {
            "clients": n, "method": SST2_CLAIM_NAMES[method], "key": method,
            "learning_rate": lr, "rounds": self.run_of(method, n, self.seeds[0], lr or 0).rounds,
            "seeds_done": f"{len(devs)}/{len(self.seeds)}",
            "test_accuracy": mean_std(tests, "{:.4f}") if tested else None,
            "test_mean": mean_of(tests) if tested else None,
            "dev_accuracy": mean_std(devs, "{:.4f}") if devs else None,
            "dev_mean": mean_of(devs) if devs else None,
            "upload_kib": mean_of(uploads) if uploads else None,
            "averaging_error": (mean_of([e for e in errors if e is not None])
                                if any(e is not None for e in errors) else None),
            "grid": None if grid is None else ", ".join(
                f"{r:g}: {'–' if a is None else f'{a:.4f}'}" for r, a in grid.items()),
            "rates_tried": None if grid is None else len(grid),
            "thin": self.runner_ups.get((method, n), (None, None))[1],
            "runner_up": self.runner_ups.get((method, n), (None, None))[0],
            "paper": paper.get((n, method), ""),
            "by_seed": by_seed,
            "reran": reran,
            # {seed: the commit its run recorded (None: a run from before the record)}.
            "commits": commits,
            # {seed: {split: per-example correctness after the last round}} (runs that kept
            # their predictions).
            "correct": correct,
        }


def _set_measures(rows: list[dict]) -> None:
    """Sets each row's `measure` and turns its `by_seed` into {seed: the claim's measure}, one
    measure per method: test accuracy (FedSA-LoRA's personalized), or personalized dev where a
    FedSA-LoRA run lacks a test figure (runs from before its test split was cut per client)."""
    for key in dict.fromkeys(r["key"] for r in rows):
        mine = [r for r in rows if r["key"] == key]
        seeds_done = [v for r in mine for v in r["by_seed"].values()]
        on_test = all(t is not None for t, _, _ in seeds_done)
        personal = "personalized " if any(p for _, _, p in seeds_done) else ""
        split = "test" if on_test else "eval"
        for r in mine:
            r["measure"] = None if not r["by_seed"] else (
                personal + ("test" if on_test else "dev"))
            r["by_seed_dev"] = {s: d for s, (_, d, _) in r["by_seed"].items()}
            r["by_seed"] = {s: t if on_test else d for s, (t, d, _) in r["by_seed"].items()}
            # The bootstrap's per-example correctness, for the global models' measure.
            r["correct_by_seed"] = {} if personal else {
                s: (c or {}).get(split) for s, c in r.get("correct", {}).items()}


def run_protocol(ctx: Context, partition: Mapping[str, Any], clients: Sequence[int],
                   centralized: bool, paper: dict | None = None, cfg: dict | None = None
                   ) -> tuple[list[dict], dict, dict]:
    """Runs (or with --collect, reads) the protocol's runs on the clients `partition` cuts
    (RunConfig fields, e.g. {"partition": "iid"}) at scale `cfg` (default:
    SST2_CLAIM_SCALES[ctx.scale]); `paper` maps (N, method) to the paper's figure for this
    setting (Table 1's SST-2 column by default). Returns the rows (one per (method, N) cell),
    the chosen rates and the grids."""
    paper = SST2_PAPER if paper is None else paper
    protocol = Protocol(ctx, SST2_CLAIM_SCALES[ctx.scale] if cfg is None else cfg, partition,
                         clients, centralized)
    protocol.run_all()
    rows = [protocol.cell_row(method, n, paper)
            for method in protocol.methods for n in protocol.client_counts(method)]
    _set_measures(rows)
    if protocol.runner_ups:
        # The same rows with each thin cell at its runner-up rate: the verdicts under them.
        runner_rows = [protocol.cell_row(m, n, paper, lr=protocol.runner_ups[(m, n)][0])
                       if (m, n) in protocol.runner_ups else protocol.cell_row(m, n, paper)
                       for m in protocol.methods for n in protocol.client_counts(m)]
        _set_measures(runner_rows)
        for row, runner_row in zip(rows, runner_rows):
            row["runner_up_row"] = runner_row
    return rows, protocol.chosen, protocol.grids


def paper_mean(method: str, n: int) -> float | None:
    cell = SST2_PAPER.get((n, method))
    return float(cell.split()[0]) if cell else None
