"""SST-2 experiments: `sst2_minilm` (3), `sst2_clients` / `sst2_dirichlet` (9, 10)
and `sst2_clients_mean` / `sst2_dirichlet_mean` (13, 14), with their verdicts.

The protocol experiments' runs and rows are `experiments.sst2_protocol`'s, their tables
`experiments.sst2_tables`'."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.sst2_protocol import (
    SST2_CLAIM_NAMES,
    SST2_CLAIM_SCALES,
    SST2_DIRICHLET_MEAN_METHODS,
    SST2_MEAN_SCALES,
    SST2_PAPER,
    paper_mean,
    run_protocol,
    sst2_rounds,
)
from experiments.sst2_tables import TABLE2_CLAIM, claim_result, iid_claims, table2_claims
from runner.estimate import active_probes
from runner.report import Column, Panel, Series, Table
from runner.running import (
    METHOD_NAMES,
    ROOT,
    Context,
    Result,
    need_data,
    run_seconds,
    run_training,
    train_config,
)

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


def run_sst2_minilm(ctx: Context) -> Result:
    need_data(ctx, "sst2/train.tsv")
    cfg = SST2_SCALES[ctx.scale]
    algorithms = cfg["algorithms"]
    rows = []
    for n in SST2_CLIENTS:
        rounds = sst2_rounds(cfg["rounds_3"], n)
        run_dir = ctx.output_dir / f"clients_{n}"
        layers = dict(lora_layers=cfg["lora_layers"]) if cfg.get("lora_layers") else {}
        run_training(train_config(
            ctx, run_dir, task="sst2", backbone=cfg["backbone"],
            sequence_length=cfg["sequence_length"], rank=4, lora_targets=("query", "value"),
            algorithm=algorithms, **layers, partition="iid", num_clients=n,
            clients_per_round=n, rounds=rounds, local_steps=cfg["local_steps"],
            batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
            eval_every=max(1, rounds // cfg["evaluations"]),
        ), f"training (SST-2, {n} clients)", ctx.isolate)
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
                "seconds": run_seconds(run_dir / algorithm),
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
                    [paper_mean(a, n) / 100 for n in SST2_CLIENTS], "--s")
             for a in ("rolora", "fedavg_lora", "ffa_lora", "flexlora")]
    panels = [
        Panel(f"ours ({cfg['backbone']}, {ctx.scale} scale)", "clients N", "SST-2 dev accuracy "
              "(best)", ours, logx=True, hlines=[("majority class", 0.5092)]),
        Panel("paper (RoBERTa-Large, Table 1)", "clients N", "SST-2 accuracy", paper, logx=True),
    ]
    return Result(Table(title, columns, rows, notes), panels,
                  "SST-2: federated LoRA at a fixed total-sample budget")


# ------------------------------------------------------------------------------------------------
# 9-10. sst2_clients and sst2_dirichlet, and 13-14.
# sst2_clients_mean and sst2_dirichlet_mean (their decisive cells, corrected classifier)


IID_PARTITION = {"partition": "iid"}
# The pooler-era archives the _mean experiments print beside their own cells (relative to the
# repository root; skipped when absent).
POOLER_ERA_ARCHIVES = {"sst2_clients_mean": "docs/runs/sst2_clients-full",
                       "sst2_dirichlet_mean": "docs/runs/sst2_dirichlet-full"}


def run_sst2_clients(ctx: Context) -> Result:
    need_data(ctx, "sst2/test-labeled.tsv")
    cfg = SST2_CLAIM_SCALES[ctx.scale]
    rows, _, _ = run_protocol(ctx, IID_PARTITION, cfg["clients"], True)
    return claim_result(ctx, rows, "IID shards, N = " + ", ".join(map(str, cfg["clients"])),
                        cfg=cfg, claims=iid_claims(rows))


def pooler_era_table(ctx: Context, rows: Sequence[dict], experiment: str,
                     partition: Mapping[str, Any], clients: Sequence[int],
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
    old, _, _ = run_protocol(old_ctx, partition, clients, centralized,
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
    need_data(ctx, "sst2/test-labeled.tsv")
    cfg = SST2_MEAN_SCALES[ctx.scale]
    rows, _, _ = run_protocol(ctx, IID_PARTITION, cfg["clients"], True, cfg=cfg)
    result = claim_result(ctx, rows, _mean_setting(cfg), cfg=cfg,
                                claims=iid_claims(rows), averaging_column=True)
    side = pooler_era_table(ctx, rows, "sst2_clients_mean", IID_PARTITION,
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
    from tasks import partition_schemes, text_files

    data = text_files.load_glue_tsv(sst2_dir, "sst2", splits=("train", "dev", "test-labeled"))
    train = data["train"].labels
    parts = partition_schemes.partition(train, num_clients, "dirichlet", seed, alpha=alpha)
    return tuple(partition_lib.majority_label_accuracy(
        train, parts, data[split].labels,
        partition_lib.split_test_like_train(train, parts, data[split].labels, seed))
        for split in ("dev", "test-labeled"))


# sst2_dirichlet's setting (RoLoRA's Table 2 skew at Table 1's middle N).
DIRICHLET_CLIENTS, DIRICHLET_ALPHA = 20, 0.5
DIRICHLET_PARTITION = {"partition": "dirichlet", "dirichlet_alpha": DIRICHLET_ALPHA}


def _dirichlet_result(ctx: Context, cfg: dict, averaging_column: bool
                      ) -> tuple[Result, list[dict]]:
    """sst2_dirichlet's protocol at scale `cfg`: its result (with the label-mix note) and rows."""
    need_data(ctx, "sst2/test-labeled.tsv")
    rows, _, _ = run_protocol(ctx, DIRICHLET_PARTITION, (DIRICHLET_CLIENTS,), False,
                                paper={}, cfg=cfg)
    result = claim_result(
        ctx, rows, f"Dirichlet({DIRICHLET_ALPHA:g}) label skew, N = {DIRICHLET_CLIENTS}",
        TABLE2_CLAIM, paper_column=False, cfg=cfg,
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
