"""SST-2 experiments: `sst2_minilm` (3), issue 19's `sst2_clients` / `sst2_dirichlet` (9, 10)
and issue 51's `sst2_clients_mean` / `sst2_dirichlet_mean` (13, 14), with their verdicts."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence

from experiments import archive
from experiments import verdicts
from experiments.report import Column, Panel, Series, Table, _missing
from experiments.running import (Context, METHOD_NAMES, Probe, ROOT, Result, SCRIPTS, _float,
                                 _mean, _mean_std, _need_data, _read_csv, active_probes,
                                 run_subprocess)


# ------------------------------------------------------------------------------------------------
# 3. sst2_minilm


SST2_CLIENTS = (3, 20, 50)
SST2_SCALES = {
    "small": dict(backbone="tiny", sequence_length=32, rounds_3=10, local_steps=5,
                  batch_size=16, learning_rate=0.5, evaluations=2,
                  algorithms=("rolora", "fedavg_lora", "ffa_lora")),
    "full": dict(backbone="minilm", sequence_length=32, rounds_3=60, local_steps=10,
                 batch_size=16, learning_rate=0.3, evaluations=6, lora_layers="3,4,5",
                 algorithms=("rolora", "fedavg_lora", "ffa_lora")),
}
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


def _train_args(ctx: Context, run_dir: pathlib.Path, extra: Sequence[str]) -> list[str]:
    args = [SCRIPTS / "train.py", *extra, f"--seed={ctx.seed}", f"--data_dir={ctx.data_dir}",
            f"--output_dir={run_dir}"]
    if ctx.resume:
        args.append("--resume")  # continues from the checkpoints; a run with none starts afresh
    return args


def run_sst2_minilm(ctx: Context) -> Result:
    _need_data(ctx, "sst2/train.tsv")
    cfg = SST2_SCALES[ctx.scale]
    algorithms = cfg["algorithms"]
    rows = []
    for n in SST2_CLIENTS:
        rounds = sst2_rounds(cfg["rounds_3"], n)
        run_dir = ctx.output_dir / f"clients_{n}"
        run_subprocess(_train_args(ctx, run_dir, [
            "--task=sst2", f"--backbone={cfg['backbone']}",
            f"--sequence_length={cfg['sequence_length']}", "--rank=4",
            "--lora_targets=query,value", f"--algorithm={','.join(algorithms)}",
            *([f"--lora_layers={cfg['lora_layers']}"] if cfg.get("lora_layers") else []),
            "--partition=iid", f"--num_clients={n}", f"--clients_per_round={n}",
            f"--rounds={rounds}", f"--local_steps={cfg['local_steps']}",
            f"--batch_size={cfg['batch_size']}", f"--learning_rate={cfg['learning_rate']}",
            f"--eval_every={max(1, rounds // cfg['evaluations'])}",
        ]), f"scripts/train.py (SST-2, {n} clients)")
        for algorithm in algorithms:
            summary = json.loads((run_dir / algorithm / "summary.json").read_text())
            comm = max(1, summary["communication_rounds"])
            rows.append({
                "clients": n, "method": METHOD_NAMES[algorithm], "algorithm": algorithm,
                "communication_rounds": summary["communication_rounds"],
                "samples_per_client_per_round": cfg["local_steps"] * cfg["batch_size"],
                "final_accuracy": summary["final"].get("eval_accuracy"),
                "best_accuracy": summary["best_eval_accuracy"],
                "upload_kib": summary["upload_bytes_per_client_total"] / comm / 1024,
                "paper": SST2_PAPER[n, algorithm],
                "seconds": _run_seconds(run_dir / algorithm),
            })
    backbone = ("all-MiniLM-L6-v2 (pretrained, 6 layers, 384 wide)" if cfg["backbone"] == "minilm"
                else "a random 2-layer, 64-wide BERT (`--backbone=tiny`, no pretraining)")
    title = (
        f"Federated LoRA on SST-2 (rolora.md §3.2, Table 1): {backbone}, LoRA rank 4 on query and "
        f"value of {'layers ' + cfg['lora_layers'] if cfg.get('lora_layers') else 'every layer'}, "
        f"{cfg['sequence_length']} tokens, IID disjoint shards of the "
        f"67,349 training sentences, all clients every round, {cfg['local_steps']} local SGD "
        f"steps of batch {cfg['batch_size']} per communication round, learning rate "
        f"{cfg['learning_rate']:g}, seed {ctx.seed}; rounds R_N = ⌊{cfg['rounds_3']}·3/N + ½⌋ "
        f"(constant total samples, the same for every method); accuracy on the SST-2 dev "
        f"set (872 sentences; 50.92% are positive). Paper: RoBERTa-Large (355M), LoRA on W_q, "
        f"W_v of layers 18–23, 500 rounds × 20 steps of batch 64 for 3 clients, best test "
        f"accuracy over an LR grid and rounds, mean ± std over seeds.")
    notes = ["Paper's claims (rolora.md §3.2): FedAvg-LoRA (LoRA) deteriorates as the number of "
             "clients grows while RoLoRA keeps its accuracy; FFA-LoRA also declines; FlexLoRA "
             "degrades badly at many clients; RoLoRA uploads half of FedAvg-LoRA and FlexLoRA."]
    columns = [
        Column("clients", "clients"), Column("method", "method"),
        Column("comm. rounds", "communication_rounds"),
        Column("dev acc (final)", "final_accuracy", "{:.4f}"),
        Column("dev acc (best)", "best_accuracy", "{:.4f}"),
        Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
        Column("paper SST-2 acc % (RoBERTa-L, r=4)", "paper"),
        Column("training seconds", "seconds", "{:.0f}"),
    ]
    ours = [Series(METHOD_NAMES[a], SST2_CLIENTS,
                   [r["best_accuracy"] for r in rows if r["algorithm"] == a])
            for a in algorithms]
    paper = [Series(METHOD_NAMES[a], SST2_CLIENTS,
                    [_paper_mean(a, n) / 100 for n in SST2_CLIENTS], "--s")
             for a in ("rolora", "fedavg_lora", "ffa_lora", "flexlora")]
    panels = [
        Panel(f"ours ({cfg['backbone']}, {ctx.scale} scale)", "clients N", "SST-2 dev accuracy "
              "(best)", ours, logx=True, hlines=[("majority class", 0.5092)]),
        Panel("paper (RoBERTa-Large, Table 1)", "clients N", "SST-2 accuracy", paper, logx=True),
    ]
    return Result(Table(title, columns, rows, notes), panels,
                  "SST-2: federated LoRA at a fixed total-sample budget")


def _run_seconds(run_dir: pathlib.Path) -> float:
    """Training seconds of a train.py run, summed over its metrics rows (resume-proof)."""
    rows = _read_csv(run_dir / "metrics.csv") if (run_dir / "metrics.csv").exists() else []
    return sum(_float(r.get("round_seconds")) for r in rows if not _missing(r.get("round_seconds")))


# ------------------------------------------------------------------------------------------------
# 9-10. sst2_clients and sst2_dirichlet (issue 19, experiments 1 and 2), and 13-14.
# sst2_clients_mean and sst2_dirichlet_mean (issue 51: their decisive cells, corrected classifier)


# RoLoRA's protocol (rolora.md §3.1): the same local steps per client per round for every N,
# R_N = R_3·3/N (a constant total sample count), full participation; each method's learning rate
# chosen on the dev set from a grid (at the first seed and the smallest N), accuracy reported on
# the labeled test split; `seeds` seeds per cell.
SST2_CLAIM_METHODS = {
    "rolora": ["--algorithm=rolora"],
    "fedavg_lora": ["--algorithm=fedavg_lora"],
    "ffa_lora": ["--algorithm=ffa_lora"],
    "flexlora": ["--algorithm=flexlora"],
    "flora": ["--algorithm=flora"],
    "fedsa_lora": ["--algorithm=fedsa_lora"],
    "rolora_ffa": ["--algorithm=rolora_ffa", "--rolora_fraction=0.2"],
}
SST2_CLAIM_ALL = (*SST2_CLAIM_METHODS, "centralized")  # --methods' names
SST2_CLAIM_NAMES = {**METHOD_NAMES, "flora": "FLoRA", "fedsa_lora": "FedSA-LoRA",
                    "rolora_ffa": "20% RoLoRA + 80% FFA-LoRA", "centralized": "centralized LoRA"}
# sst2_clients and sst2_dirichlet: the frozen-pooler protocol. Their archived runs
# (docs/runs/sst2_clients-full, docs/runs/sst2_dirichlet-full) classified tanh(pooler(h_[CLS]))
# with BERT's pooler frozen and never trained (for MiniLM a random projection), on sentences cut
# at 32 tokens. Their command lines pass --pooling=pooler --sequence_length=32 explicitly; since
# issue 51 `--pooling=pooler` trains the pooler, so a rerun is not the archived protocol (the
# archives are what they are).
SST2_CLAIM_SCALES = {
    "small": dict(backbone="tiny", pooling="pooler", sequence_length=32, rounds_3=6,
                  local_steps=5, batch_size=16, learning_rates=(0.5,), seeds=1, clients=(3, 20)),
    "full": dict(backbone="minilm", pooling="pooler", sequence_length=32, lora_layers="3,4,5",
                 rounds_3=500, local_steps=10, batch_size=16, learning_rates=(0.1, 0.3, 1.0),
                 seeds=3, clients=(3, 20, 50), grid_every_n=True, edge_rates=(0.03, 3.0)),
}
# sst2_clients_mean and sst2_dirichlet_mean (issue 51, item 6): the cells the claims rest on,
# rerun with the corrected classifier: mean pooling (MiniLM's own), a linear head, whole sentences
# (no --sequence_length: train.py's default is the longest tokenized example). A scale's
# `methods` are the methods the experiment has (default: all of SST2_CLAIM_METHODS) and
# `method_clients` a method's own client counts (default: the experiment's): FlexLoRA runs only
# at the largest N, where its collapse is claimed.
SST2_MEAN_METHODS = ("rolora", "fedavg_lora", "ffa_lora", "flexlora")
SST2_DIRICHLET_MEAN_METHODS = ("rolora", "fedavg_lora")
SST2_MEAN_SCALES = {
    "small": dict(SST2_CLAIM_SCALES["small"], pooling="mean", head="linear",
                  sequence_length=None, methods=SST2_MEAN_METHODS,
                  method_clients={"flexlora": (20,)}),
    "full": dict(backbone="minilm", pooling="mean", head="linear", sequence_length=None,
                 lora_layers="3,4,5", rounds_3=500, local_steps=10, batch_size=16,
                 learning_rates=(0.1, 0.3, 1.0), edge_rates=(0.01, 0.03, 3.0, 10.0), seeds=3,
                 clients=(3, 50), grid_every_n=True, methods=SST2_MEAN_METHODS,
                 method_clients={"flexlora": (50,)}),
}
# The pooler-era archives the _mean experiments print beside their own cells (relative to the
# repository root; skipped when absent).
POOLER_ERA_ARCHIVES = {"sst2_clients_mean": "docs/runs/sst2_clients-full",
                       "sst2_dirichlet_mean": "docs/runs/sst2_dirichlet-full"}
# metrics.csv's FedAvg-LoRA averaging-error column ends in this (finalizer/averaging_error).
AVERAGING_ERROR = "averaging_error"


@dataclasses.dataclass(frozen=True)
class Sst2Run:
    """One train.py run of the SST-2 protocol and where it goes."""

    method: str
    clients: int
    seed: int
    learning_rate: float
    rounds: int
    run_dir: pathlib.Path


def _classifier_args(cfg: dict) -> list[str]:
    """--pooling, --head and --sequence_length as the scale sets them (None: train.py's default;
    for --sequence_length, whole sentences)."""
    return [f"--{flag}={cfg[flag]}" for flag in ("pooling", "head", "sequence_length")
            if cfg.get(flag) is not None]


def sst2_claim_args(cfg: dict, run: Sst2Run, partition: Sequence[str], data_dir) -> list:
    method = ["--algorithm=fedavg_lora"] if run.method == "centralized" else \
        SST2_CLAIM_METHODS[run.method]
    return [SCRIPTS / "train.py", "--task=sst2", "--eval_test", f"--backbone={cfg['backbone']}",
            *_classifier_args(cfg), "--rank=4", "--lora_targets=query,value",
            *([f"--lora_layers={cfg['lora_layers']}"] if cfg.get("lora_layers") else []),
            *method, *partition, f"--num_clients={run.clients}",
            f"--clients_per_round={run.clients}", f"--rounds={run.rounds}",
            f"--local_steps={cfg['local_steps']}", f"--batch_size={cfg['batch_size']}",
            f"--learning_rate={run.learning_rate}", f"--eval_every={max(1, run.rounds // 5)}",
            f"--seed={run.seed}", f"--data_dir={data_dir}", f"--output_dir={run.run_dir}"]


def _finished(run: Sst2Run) -> dict | None:
    """The run's summary.json if it completed all its rounds."""
    return archive.finished_summary(run.run_dir, run.rounds)


def _claim_name(final: dict, key: str) -> str:
    if "eval_personal_accuracy" in final:
        return {"eval_accuracy": "eval_personal_accuracy",
                "eval_test_accuracy": "eval_personal_test_accuracy"}[key]
    return key


def _claim_accuracy(summary: dict, key: str) -> float | None:
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


def _rerun_note(summary: dict, key: str) -> str | None:
    """How the run and its rerun compare, when the `key` figure came from the rerun."""
    final, rerun = summary["final"], summary.get(archive.RERUN, {}).get("final", {})
    name, dev = _claim_name(final, key), _claim_name(final, "eval_accuracy")
    if name in final or name not in rerun:
        return None
    return f"dev {final[dev]:.4f} → {rerun[dev]:.4f}" if dev in final and dev in rerun else ""


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
    values = [_float(r[names[0]]) for r in metrics if names and not _missing(r.get(names[0]))]
    return _mean(values) if values else None


def _run_averaging_error(run_dir: pathlib.Path) -> float | None:
    path = run_dir / "metrics.csv"
    return mean_averaging_error(_read_csv(path)) if path.exists() else None


class _Protocol:
    """The runs of one SST-2 protocol experiment at scale `cfg`, in their order; each through
    `archive.train_once` (with --collect, only read), or under --estimate a probe."""

    def __init__(self, ctx: Context, cfg: dict, partition: Sequence[str],
                 clients: Sequence[int], centralized: bool):
        self.ctx, self.cfg, self.partition, self.clients = ctx, cfg, list(partition), clients
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
        what = (f"train.py ({run.method}, N={run.clients}, seed {run.seed}, "
                f"lr {run.learning_rate:g})")
        args = sst2_claim_args(self.cfg, run, self.partition, self.ctx.data_dir)
        probes = active_probes()
        if probes is not None:
            # --estimate: one probe per N (the first method's, and the centralized run's):
            # seeds and learning rates cost the same, and the methods differ only in what they
            # upload and in the server step.
            key = (run.method == "centralized", run.clients)
            if key not in self.probed:
                start = len(probes)
                run_subprocess(args, what)
                self.probed[key] = probes[start:]
            elif run.run_dir not in self.counted:
                probes.extend(dataclasses.replace(p, what=what) for p in self.probed[key])
            self.counted.add(run.run_dir)
            return {"final": {"eval_accuracy": 0.0, "eval_test_accuracy": 0.0},
                    "communication_rounds": 1, "upload_bytes_per_client_total": 0}
        return archive.train_once(
            run.run_dir, run.rounds,
            None if self.ctx.collect else lambda resume: run_subprocess(
                args + (["--resume"] if resume else []), what),
            self.ctx.output_dir, self.ctx.archive_dir)

    def run_grid(self, method: str, n: int) -> float | None:
        """The grid's best rate (of equal dev accuracies, the smallest rate); a best rate at an
        edge of the grid brings in the nearest of cfg["edge_rates"] beyond that edge, until the
        best is inside or none is left."""
        rates, grid = sorted(self.cfg["learning_rates"]), {}
        while True:
            for lr in rates:
                if lr not in grid:
                    summary = self.execute(self.run_of(method, n, self.seeds[0], lr))
                    grid[lr] = (None if summary is None
                                else _claim_accuracy(summary, "eval_accuracy"))
            self.grids[(method, n)] = dict(sorted(grid.items()))
            if any(acc is None for acc in grid.values()):
                return None
            best = max(rates, key=grid.get)  # the first of equals: the smallest rate
            beyond = [r for r in self.cfg.get("edge_rates", ()) if
                      (best == rates[0] and r < best) or (best == rates[-1] and r > best)]
            if not beyond:
                return best
            rates = sorted([*rates, min(beyond, key=lambda r: abs(math.log(r / best)))])

    def run_all(self) -> None:
        """Runs (or finds) every run, in the order that leaves an experiment stopped part-way
        its most telling cells: per method (RoLoRA, FedAvg-LoRA, the centralized run, FFA-LoRA,
        ...), its learning-rate grid at the smallest N, then its first seed at every other N,
        largest first (its grid there, with cfg["grid_every_n"]); only then the other seeds,
        method by method. (A grid's run at the chosen rate is that method's first seed at that
        N.) The centralized run comes right after FedAvg-LoRA, since the two decide whether the
        budget is large enough."""
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

    def cell_row(self, method: str, n: int, paper: dict) -> dict:
        """The table's row of one (method, N) cell, from its finished runs (all of them
        finished by `run_all`, or with --collect, not run)."""
        lr, grid = self.chosen[(method, n)], self.grids.get((method, n))
        tests, devs, uploads, errors, by_seed, reran = [], [], [], [], {}, []
        for seed in self.seeds:
            run = self.run_of(method, n, seed, lr or 0)
            summary = self.execute(run) if lr is not None else None
            if summary is None:
                continue
            devs.append(_claim_accuracy(summary, "eval_accuracy"))
            tests.append(_claim_accuracy(summary, "eval_test_accuracy"))
            note = _rerun_note(summary, "eval_test_accuracy")
            if note is not None:
                reran.append(f"{SST2_CLAIM_NAMES[method]}, N = {n}, seed {seed}"
                             + (f" ({note})" if note else ""))
            by_seed[seed] = (tests[-1], devs[-1], "eval_personal_accuracy" in summary["final"])
            comm = max(1, summary["communication_rounds"])
            uploads.append(summary["upload_bytes_per_client_total"] / comm / 1024)
            errors.append(_run_averaging_error(run.run_dir))
        tested = bool(tests) and None not in tests
        return {
            "clients": n, "method": SST2_CLAIM_NAMES[method], "key": method,
            "learning_rate": lr, "rounds": self.run_of(method, n, self.seeds[0], lr or 0).rounds,
            "seeds_done": f"{len(devs)}/{len(self.seeds)}",
            "test_accuracy": _mean_std(tests, "{:.4f}") if tested else None,
            "test_mean": _mean(tests) if tested else None,
            "dev_accuracy": _mean_std(devs, "{:.4f}") if devs else None,
            "dev_mean": _mean(devs) if devs else None,
            "upload_kib": _mean(uploads) if uploads else None,
            "averaging_error": (_mean([e for e in errors if e is not None])
                                if any(e is not None for e in errors) else None),
            "grid": None if grid is None else ", ".join(
                f"{r:g}: {'–' if a is None else f'{a:.4f}'}" for r, a in grid.items()),
            "paper": paper.get((n, method), ""),
            "by_seed": by_seed,
            "reran": reran,
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
        for r in mine:
            r["measure"] = None if not r["by_seed"] else (
                personal + ("test" if on_test else "dev"))
            r["by_seed"] = {s: t if on_test else d for s, (t, d, _) in r["by_seed"].items()}


def _sst2_protocol(ctx: Context, partition: Sequence[str], clients: Sequence[int],
                   centralized: bool, paper: dict | None = None, cfg: dict | None = None
                   ) -> tuple[list[dict], dict, dict]:
    """Runs (or with --collect, reads) the protocol's runs at scale `cfg` (default:
    SST2_CLAIM_SCALES[ctx.scale]); `paper` maps (N, method) to the paper's figure for this
    setting (Table 1's SST-2 column by default). Returns the rows (one per (method, N) cell),
    the chosen rates and the grids."""
    paper = SST2_PAPER if paper is None else paper
    protocol = _Protocol(ctx, SST2_CLAIM_SCALES[ctx.scale] if cfg is None else cfg, partition,
                         clients, centralized)
    protocol.run_all()
    rows = [protocol.cell_row(method, n, paper)
            for method in protocol.methods for n in protocol.client_counts(method)]
    _set_measures(rows)
    return rows, protocol.chosen, protocol.grids


def _paper_mean(method: str, n: int) -> float | None:
    cell = SST2_PAPER.get((n, method))
    return float(cell.split()[0]) if cell else None


def degradation_rows(rows: Sequence[dict]) -> list[dict]:
    """Accuracy points each method loses from its smallest N to every larger N, paired by seed.

    With a(N, s) the claim's accuracy at N and seed s (its row's `measure`), the
    drop to N is d_s = 100·(a(N_0, s) − a(N, s)) over the seeds s finished at both N_0 and N;
    `drop_<N>` is mean ± std of the d_s (the sample std, ddof = 1: Σ (d_s − d̄)² / (n − 1)),
    `seeds_<N>` their number n and `per_seed_<N>` each d_s as "s: d_s". `paper_drop_<N>` is
    the difference of the paper's Table 1 means. Methods run at one N only (the centralized
    run) have no row.

    >>> rows = [dict(key="rolora", method="RoLoRA", clients=n, by_seed=acc, measure="test")
    ...         for n, acc in ((3, {0: 0.85, 1: 0.84}), (50, {0: 0.82, 1: 0.83, 2: 0.8}))]
    >>> row, = degradation_rows(rows)       # drops 3 and 1: mean 2, std √((1 + 1) / 1)
    >>> row["drop_50"], row["seeds_50"], row["per_seed_50"], row["paper_drop_50"]
    ('2.00 ± 1.41', 2, '0: 3.00, 1: 1.00', 0.69)
    """
    out = []
    for key in dict.fromkeys(r["key"] for r in rows):
        mine = sorted((r for r in rows if r["key"] == key), key=lambda r: r["clients"])
        if len(mine) < 2:
            continue
        first, *rest = mine
        row = {"method": first["method"], "measure": first["measure"]}
        for r in rest:
            n = r["clients"]
            paired = sorted(first["by_seed"].keys() & r["by_seed"].keys())
            drops = [100 * (first["by_seed"][s] - r["by_seed"][s]) for s in paired]
            row[f"drop_{n}"] = _mean_std(drops, "{:.2f}") if drops else None
            row[f"seeds_{n}"] = len(drops)
            row[f"per_seed_{n}"] = ", ".join(f"{s}: {d:.2f}" for s, d in zip(paired, drops))
            p0, p = _paper_mean(key, first["clients"]), _paper_mean(key, n)
            row[f"paper_drop_{n}"] = None if p0 is None or p is None else round(p0 - p, 2)
        out.append(row)
    return out


def _degradation_table(rows: Sequence[dict]) -> Table | None:
    clients = sorted({r["clients"] for r in rows if r["key"] != "centralized"})
    if len(clients) < 2:
        return None
    n0, *rest = clients
    columns = [Column("method", "method"), Column("measure", "measure")]
    for n in rest:
        columns += [Column(f"drop {n0} → {n} (points)", f"drop_{n}"),
                    Column(f"seeds {n0} & {n}", f"seeds_{n}"),
                    Column(f"per seed {n0} → {n} (seed: points)", f"per_seed_{n}")]
    columns += [Column(f"paper drop {n0} → {n} (RoBERTa-L)", f"paper_drop_{n}", "{:.2f}")
                for n in rest]
    title = (f"Degradation as N grows (the claim's measure): accuracy points lost from N = {n0} "
             f"to each larger N, per seed finished at both: mean ± std over those seeds (the "
             f"sample std, ddof = 1: it divides by their number minus one) and each seed's "
             f"drop; the paper's drop is the difference of its means. A method's verdicts are "
             f"in claims.md.")
    return Table(title, columns, degradation_rows(rows))


_TABLE1_CLAIM = ("Paper's claim (rolora.md §3.2, Table 1): RoLoRA degrades least as N grows "
                 "(94.80 at N = 50 against FedAvg-LoRA's 93.00); FFA-LoRA declines; FlexLoRA "
                 "collapses at N = 50.")
_TABLE2_CLAIM = ("Paper's claim (rolora.md §3.2, NeurIPS Table 2: RoBERTa-Large on MNLI and QQP, "
                 "Dir(0.5) over 10 clients and Dir(1.0) over 15; no SST-2 figure, so no paper "
                 "column here): under label skew RoLoRA is the most accurate (MNLI, Dir(0.5): "
                 "82.60 against LoRA's 81.19, FFA-LoRA's 75.60 and FlexLoRA's 35.45; QQP: 84.16, "
                 "82.60, 81.47, 63.24) and FlexLoRA collapses.")


def _paper_difference(terms: Sequence[tuple[float, str, int]]) -> float | None:
    """Σ c·(the paper's Table 1 mean of method at N), rounded to 0.01; None if one is missing."""
    values = [_paper_mean(method, n) for _, method, n in terms]
    return None if None in values else round(sum(c * v for (c, _, _), v in zip(terms, values)), 2)


# A collapse (claim (d)): a gap of more than this many points (the paper's is 38.92 at N = 50).
COLLAPSE_POINTS = 10.0


def table1_claims(n0: int, n1: int) -> list[verdicts.Claim]:
    """Table 1's claims (rolora.md §3.2) between the smallest N, n0, and the largest, n1, each a
    paired per-seed difference of accuracies whose paper direction is > 0, with the paper's
    value of the same difference of its means (RoBERTa-Large).

    >>> [(c.label, c.paper) for c in table1_claims(3, 50)]
    [('(a)', 1.93), ('(b)', 1.8), ('(c)', 1.95), ('(d)', 28.92), ('(e)', 1.57)]
    """
    r, f, a, x = "rolora", "fedavg_lora", "ffa_lora", "flexlora"
    drop = f"drop = a(N = {n0}) − a(N = {n1})"
    specs = [
        ("(a)", f"RoLoRA degrades less than FedAvg-LoRA from N = {n0} to {n1}",
         f"drop FedAvg-LoRA − drop RoLoRA, {drop}", ((1, f, n0), (-1, f, n1), (-1, r, n0),
                                                      (1, r, n1)), ""),
        ("(b)", f"RoLoRA more accurate than FedAvg-LoRA at N = {n1}",
         f"RoLoRA − FedAvg-LoRA at N = {n1}", ((1, r, n1), (-1, f, n1)), ""),
        ("(c)", f"FFA-LoRA declines from N = {n0} to {n1}", f"drop FFA-LoRA, {drop}",
         ((1, a, n0), (-1, a, n1)), ""),
        ("(d)", f"FlexLoRA collapses at N = {n1}: over {COLLAPSE_POINTS:g} points below "
         "FedAvg-LoRA", f"FedAvg-LoRA − FlexLoRA − {COLLAPSE_POINTS:g} at N = {n1}",
         ((1, f, n1), (-1, x, n1)), COLLAPSE_POINTS),
        ("(e)", f"RoLoRA above FFA-LoRA at N = {n1}", f"RoLoRA − FFA-LoRA at N = {n1}",
         ((1, r, n1), (-1, a, n1)), ""),
    ]
    claims = []
    for label, text, difference, terms, margin in specs:
        paper = _paper_difference(terms)
        claims.append(verdicts.Claim(label, text, difference, terms,
                                     None if paper is None else round(paper - (margin or 0), 2),
                                     margin=margin or 0.0))
    return claims


def table2_claims(n: int, alpha: float) -> list[verdicts.Claim]:
    """Table 2's claim on SST-2 under Dirichlet(alpha) label skew at N = n: RoLoRA − FedAvg-LoRA
    > 0 (the paper has no SST-2 figure: its differences on MNLI and QQP stand beside it)."""
    return [verdicts.Claim(
        "(f)", f"RoLoRA more accurate than FedAvg-LoRA under Dirichlet({alpha:g}) label skew",
        f"RoLoRA − FedAvg-LoRA at N = {n}", ((1, "rolora", n), (-1, "fedavg_lora", n)),
        "MNLI +1.41, QQP +1.56 (Dir(0.5), 10 clients; no SST-2 figure)")]


_BACKBONES = {"minilm": ("all-MiniLM-L6-v2, 6 layers of width 384, 22M parameters", 6),
              "tiny": ("a random 2-layer, 64-wide BERT, `--backbone=tiny`", 2)}


def _classifier_words(cfg: dict) -> str:
    """What the scale's classifier reads, in a few words (`_classifier_note` says more)."""
    tokens = cfg.get("sequence_length")
    if cfg.get("pooling") == "pooler":
        return f"frozen-pooler protocol: BERT's untrained pooler, {tokens} tokens"
    pooling = {"mean": "mean pooling", "cls": "first-token pooling"}
    head = {"linear": "linear head", "dense_tanh": "dense + tanh head"}
    return (f"corrected classifier: {pooling.get(cfg.get('pooling'), 'default pooling')}, "
            f"{head.get(cfg.get('head'), 'default head')}, "
            + (f"{tokens} tokens" if tokens else "whole sentences"))


def _classifier_note(cfg: dict) -> str:
    if cfg.get("pooling") == "pooler":
        return ("Frozen-pooler protocol: the head read tanh(pooler(h_[CLS])) with BERT's pooler "
                "frozen and never trained (all-MiniLM-L6-v2 was trained with mean pooling: its "
                "pooler is a random projection), on sentences cut at "
                f"{cfg.get('sequence_length')} tokens. These are the archived runs' figures. The "
                "command lines now pass --pooling=pooler --sequence_length="
                f"{cfg.get('sequence_length')}; since issue 51 --pooling=pooler trains the "
                "pooler, so running them again is not this protocol.")
    return ("Corrected classifier (issue 51): "
            + {"mean": "the mean of the last hidden states over each sentence's tokens "
                       "(MiniLM's own pooling)", "cls": "the first token's last hidden state",
               }.get(cfg.get("pooling"), "the checkpoint's own pooling")
            + " into a " + {"linear": "linear head", "dense_tanh": "trained dense + tanh + "
                            "out_proj head"}.get(cfg.get("head"), "default head") + ", "
            + (f"sentences cut at {cfg['sequence_length']} tokens" if cfg.get("sequence_length")
               else "every sentence whole (train.py's default length: the longest tokenized "
                    "example)")
            + ". The frozen-pooler figures of the same cells stand beside these in "
              "pooler_era.md (at the full scale).")


def _regime(cfg: dict, rows: Sequence[dict]) -> str:
    """The regime beside each verdict: local work, LoRA layers, backbone, pooling and head,
    and what FedAvg-LoRA's averaging error shows where its runs log it."""
    name, layers = _BACKBONES.get(cfg["backbone"], (cfg["backbone"], "?"))
    lora = (f"layers {cfg['lora_layers'].replace(',', ', ')} of {layers}"
            if cfg.get("lora_layers") else f"all {layers} layers")
    steps, batch = cfg["local_steps"], cfg["batch_size"]
    errors = [(r["clients"], r["averaging_error"]) for r in rows
              if r["key"] == "fedavg_lora" and r.get("averaging_error") is not None]
    averaging = ("FedAvg-LoRA's averaging error ‖mean(A_i)·mean(B_i) − mean(A_i·B_i)‖_F / "
                 "‖mean(A_i·B_i) − A·B‖_F (the mechanism RoLoRA claims), mean over rounds and "
                 "seeds: " + "; ".join(f"N = {n}: {e:.3g}" for n, e in errors) if errors else
                 "FedAvg-LoRA's averaging error: not logged by these runs")
    return (f"Regime (ours; the paper's): local work per round {steps} steps × batch {batch} = "
            f"{steps * batch} samples per client (paper: 20 × 64 = 1,280); LoRA rank 4 on "
            f"query and value of {lora} (paper: layers 18–23 of 24); backbone {name} (paper: "
            f"RoBERTa-Large, 24 layers, 355M); pooling and head: {_classifier_words(cfg)} "
            f"(paper: RoBERTa's classification head, dense + tanh + out_proj on the first "
            f"token, trained); {averaging}.")


def _claim_title(cfg: dict, rows, setting: str) -> str:
    where = "at each N" if cfg.get("grid_every_n") else "at the smallest N"
    return (
        f"SST-2, {setting}; {_classifier_words(cfg)}. {cfg['backbone']} backbone, LoRA rank 4 "
        f"on query and value{' of layers ' + cfg['lora_layers'] if cfg.get('lora_layers') else ''}"
        f", all clients every round, {cfg['local_steps']} local SGD steps of batch "
        f"{cfg['batch_size']} per round, R_N = ⌊{cfg['rounds_3']}·3/N + ½⌋ rounds (the same "
        f"total samples for every N)"
        + ("; the centralized run trains one client for R_3 rounds (the same sequential steps "
           "as a client at N = 3)" if any(r["key"] == "centralized" for r in rows) else "")
        + f". Learning rate per method from a dev-set grid {where} (final dev accuracy, first "
        f"seed; the `lr grid` column). Test accuracy: the labeled test split (1,821 "
        f"sentences), final round, mean ± std over the seeds done (the sample std, ddof = 1). "
        + ("FedSA-LoRA keeps B personal: its figures are personalized, every sentence scored by "
           "the model of the client whose shard holds it (the dev and test splits are cut per "
           "client like the training labels). " if any(r["key"] == "fedsa_lora" for r in rows)
           else "")
        + "A cell with fewer seeds than planned is unfinished; nothing is extrapolated.")


def _claim_panels(ctx: Context, cfg: dict, rows, setting: str) -> list[Panel]:
    series = []
    for key in dict.fromkeys(r["key"] for r in rows if r["key"] != "centralized"):
        mine = [r for r in rows if r["key"] == key]
        series.append(Series(SST2_CLAIM_NAMES[key], [r["clients"] for r in mine],
                             [r["test_mean"] if (r["measure"] or "").endswith("test")
                              else r["dev_mean"] for r in mine]))
    central = [r for r in rows if r["key"] == "centralized" and r["test_mean"] is not None]
    fedsa = next((r["measure"] for r in rows if r["key"] == "fedsa_lora" and r["measure"]), None)
    return [Panel(f"SST-2 {setting} ({cfg['backbone']}, {ctx.scale} scale)", "clients N",
                  "test accuracy (final" + (f"; FedSA-LoRA: {fedsa}" if fedsa else "") + ")",
                  series, logx=True,
                  hlines=[("majority class", 0.5092)]
                  + ([("centralized", central[0]["test_mean"])] if central else []))]


def _sst2_claim_result(ctx: Context, rows, setting: str, claim: str = _TABLE1_CLAIM,
                       paper_column: bool = True, cfg: dict | None = None,
                       claims: Sequence[verdicts.Claim] = (),
                       averaging_column: bool = False) -> Result:
    """The main table (with the `averaging_column`: FedAvg-LoRA's mean averaging error), the
    plot, `drops` (with two N or more) and `claims` (the verdicts of `claims` whose cells ran)."""
    cfg = SST2_CLAIM_SCALES[ctx.scale] if cfg is None else cfg
    notes = [claim, _classifier_note(cfg)]
    reran = [entry for r in rows for entry in r.get("reran", ())]
    if reran:
        notes.append("Test figures from a rerun with the same flags and seed, the run having "
                     "kept no checkpoint to evaluate (its summary.json's `rerun`), with the "
                     "run's dev figure → the rerun's: " + "; ".join(reran) + ".")
    columns = [Column("clients", "clients"), Column("method", "method"),
               Column("lr", "learning_rate", "{:g}"), Column("comm. rounds", "rounds"),
               Column("seeds done", "seeds_done"), Column("test acc", "test_accuracy"),
               Column("dev acc", "dev_accuracy"),
               Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
               *([Column("averaging error (FedAvg-LoRA; mean over rounds, seeds)",
                         "averaging_error", "{:.4g}")] if averaging_column else []),
               Column("lr grid (dev acc, seed 0)", "grid"),
               *([Column("paper SST-2 acc % (RoBERTa-L)", "paper")] if paper_column else [])]
    extra = {}
    drops = _degradation_table(rows)
    if drops:
        extra["drops"] = drops
    verdict_table = verdicts.claims_table(claims, rows, _regime(cfg, rows), [
        "Claims whose methods did not run are left out. The differences are per seed, between "
        "runs of the same seed; each cell at its own chosen learning rate."])
    if verdict_table:
        extra["claims"] = verdict_table
    return Result(Table(_claim_title(cfg, rows, setting), columns, rows, notes),
                  _claim_panels(ctx, cfg, rows, setting), f"SST-2 {setting}: federated LoRA",
                  extra)


def _iid_claims(rows: Sequence[dict]) -> list[verdicts.Claim]:
    clients = sorted({r["clients"] for r in rows if r["key"] != "centralized"})
    return table1_claims(clients[0], clients[-1]) if len(clients) > 1 else []


def run_sst2_clients(ctx: Context) -> Result:
    _need_data(ctx, "sst2/test-labeled.tsv")
    cfg = SST2_CLAIM_SCALES[ctx.scale]
    rows, _, _ = _sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], True)
    return _sst2_claim_result(ctx, rows, "IID shards, N = " + ", ".join(map(str, cfg["clients"])),
                              cfg=cfg, claims=_iid_claims(rows))


def pooler_era_table(ctx: Context, rows: Sequence[dict], experiment: str,
                     partition: Sequence[str], clients: Sequence[int],
                     centralized: bool) -> Table | None:
    """Each cell of a _mean experiment beside the same cell of its pooler-era archive
    (POOLER_ERA_ARCHIVES, read in place, full scale only); None when the archive is absent,
    at the small scale and under --estimate."""
    folder = ROOT / POOLER_ERA_ARCHIVES[experiment]
    if ctx.scale != "full" or active_probes() is not None or not folder.is_dir():
        return None
    old_ctx = dataclasses.replace(ctx, output_dir=folder, collect=True, resume=True,
                                  archive_dir=None,
                                  methods=tuple(dict.fromkeys(r["key"] for r in rows)))
    old, _, _ = _sst2_protocol(old_ctx, partition, clients, centralized,
                               cfg=SST2_CLAIM_SCALES["full"])
    old = {(r["key"], r["clients"]): r for r in old}
    out = []
    for r in rows:
        o = old.get((r["key"], r["clients"]), {})
        change = (None if o.get("test_mean") is None or r["test_mean"] is None
                  else 100 * (r["test_mean"] - o["test_mean"]))
        out.append({"cell": f"{r['method']}, N = {r['clients']}",
                    "old_lr": o.get("learning_rate"), "old_test": o.get("test_accuracy"),
                    "old_seeds": o.get("seeds_done"), "new_lr": r["learning_rate"],
                    "new_test": r["test_accuracy"], "new_seeds": r["seeds_done"],
                    "change": change})
    columns = [Column("cell", "cell"), Column("pooler-era lr", "old_lr", "{:g}"),
               Column("pooler-era test acc", "old_test"),
               Column("pooler-era seeds", "old_seeds"), Column("new lr", "new_lr", "{:g}"),
               Column("new test acc", "new_test"), Column("new seeds", "new_seeds"),
               Column("new − pooler-era (points)", "change", "{:+.2f}")]
    title = (f"The cells rerun, beside their pooler-era figures (frozen-pooler protocol: BERT's "
             f"untrained pooler, 32 tokens; {POOLER_ERA_ARCHIVES[experiment]}): test accuracy "
             f"at each protocol's own chosen learning rate, mean ± std (ddof = 1) over the "
             f"seeds done; the last column is the difference of the two means.")
    return Table(title, columns, out)


def _mean_setting(cfg: dict) -> str:
    only = "; ".join(f"{SST2_CLAIM_NAMES[m]} at N = {', '.join(map(str, ns))} only"
                     for m, ns in cfg.get("method_clients", {}).items())
    return "IID shards, N = " + ", ".join(map(str, cfg["clients"])) + (f" ({only})" if only
                                                                       else "")


def run_sst2_clients_mean(ctx: Context) -> Result:
    _need_data(ctx, "sst2/test-labeled.tsv")
    cfg = SST2_MEAN_SCALES[ctx.scale]
    rows, _, _ = _sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], True, cfg=cfg)
    result = _sst2_claim_result(ctx, rows, _mean_setting(cfg), cfg=cfg,
                                claims=_iid_claims(rows), averaging_column=True)
    side = pooler_era_table(ctx, rows, "sst2_clients_mean", ["--partition=iid"],
                            SST2_CLAIM_SCALES["full"]["clients"], True)
    if side is not None:
        result.extra_tables["pooler_era"] = side
    return result


def label_mix_accuracy(sst2_dir: pathlib.Path, num_clients: int, alpha: float,
                       seed: int) -> tuple[float, float]:
    """(dev, test) pooled accuracy of each client answering every sentence of its shards with
    its most common training label (`partition.majority_label_accuracy`), on the shards a
    `--partition=dirichlet` run with this seed cuts: the model-free reference for FedSA-LoRA's
    personalized figures under label skew."""
    from tasks import partition as partition_lib
    from tasks import text_files

    data = text_files.load_glue_tsv(sst2_dir, "sst2", splits=("train", "dev", "test-labeled"))
    train = data["train"].labels
    parts = partition_lib.partition(train, num_clients, "dirichlet", seed, alpha=alpha)
    return tuple(partition_lib.majority_label_accuracy(
        train, parts, data[split].labels,
        partition_lib.split_test_like_train(train, parts, data[split].labels, seed))
        for split in ("dev", "test-labeled"))


# sst2_dirichlet's setting (RoLoRA's Table 2 skew at Table 1's middle N).
DIRICHLET_CLIENTS, DIRICHLET_ALPHA = 20, 0.5
DIRICHLET_PARTITION = ("--partition=dirichlet", f"--dirichlet_alpha={DIRICHLET_ALPHA:g}")


def _dirichlet_result(ctx: Context, cfg: dict, averaging_column: bool
                      ) -> tuple[Result, list[dict]]:
    """sst2_dirichlet's protocol at scale `cfg`: its result (with the label-mix note) and rows."""
    _need_data(ctx, "sst2/test-labeled.tsv")
    rows, _, _ = _sst2_protocol(ctx, DIRICHLET_PARTITION, (DIRICHLET_CLIENTS,), False,
                                paper={}, cfg=cfg)
    result = _sst2_claim_result(
        ctx, rows, f"Dirichlet({DIRICHLET_ALPHA:g}) label skew, N = {DIRICHLET_CLIENTS}",
        _TABLE2_CLAIM, paper_column=False, cfg=cfg,
        claims=table2_claims(DIRICHLET_CLIENTS, DIRICHLET_ALPHA),
        averaging_column=averaging_column)
    seeds = [ctx.seed + s for s in range(cfg["seeds"])]
    mix = [label_mix_accuracy(ctx.data_dir / "sst2", DIRICHLET_CLIENTS, DIRICHLET_ALPHA, seed)
           for seed in seeds]
    result.table.notes = [*result.table.notes, (
        "Without a model: each client answering every sentence of its shards with its most "
        "common training label scores, pooled like FedSA-LoRA's personalized figures, "
        + "; ".join(f"dev {dev:.4f}, test {test:.4f} at seed {seed}"
                    for seed, (dev, test) in zip(seeds, mix))
        + " (what a client's label mix alone gives a personal model; a global model cannot "
        "use it).")]
    return result, rows


def run_sst2_dirichlet(ctx: Context) -> Result:
    return _dirichlet_result(ctx, SST2_CLAIM_SCALES[ctx.scale], False)[0]


def run_sst2_dirichlet_mean(ctx: Context) -> Result:
    cfg = dict(SST2_MEAN_SCALES[ctx.scale], methods=SST2_DIRICHLET_MEAN_METHODS,
               method_clients={})
    result, rows = _dirichlet_result(ctx, cfg, True)
    side = pooler_era_table(ctx, rows, "sst2_dirichlet_mean", DIRICHLET_PARTITION,
                            (DIRICHLET_CLIENTS,), False)
    if side is not None:
        result.extra_tables["pooler_era"] = side
    return result
