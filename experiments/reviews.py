"""Review-domain experiments: `reviews_fedrep_rolora` (4) and `reviews_domains` (11)."""

from __future__ import annotations

import json

from experiments.sst2_protocol import SST2_CLAIM_NAMES
from runner import archive
from runner.report import Column, Panel, Series, Table
from runner.run_config import RunConfig
from runner.running import (
    METHOD_NAMES,
    Context,
    Result,
    eval_curve,
    need_data,
    run_seconds,
    run_training,
    train_config,
)

# ------------------------------------------------------------------------------------------------
# 4. reviews_fedrep_rolora


REVIEWS_ALGORITHMS = ("fedrep", "rolora", "fedavg_lora")
REVIEWS_SCALES = {
    "small": dict(backbone="tiny", sequence_length=32, num_clients=5, rounds=10, local_steps=5,
                  batch_size=16, learning_rate=0.5, head_epochs=2),
    "full": dict(backbone="minilm", sequence_length=64, num_clients=5, rounds=40,
                 local_steps=10, batch_size=16, learning_rate=1.0, head_epochs=5),
}


def run_reviews_fedrep_rolora(ctx: Context) -> Result:
    need_data(ctx, "multidomain_sentiment")
    cfg = REVIEWS_SCALES[ctx.scale]
    run_dir = ctx.output_dir / "reviews"
    run_training(train_config(
        ctx, run_dir, task="reviews", backbone=cfg["backbone"],
        sequence_length=cfg["sequence_length"], rank=4, lora_targets=("query", "value"),
        algorithm=REVIEWS_ALGORITHMS, representation="lora_alternating",
        head_epochs=cfg["head_epochs"], num_clients=cfg["num_clients"],
        clients_per_round=cfg["num_clients"], rounds=cfg["rounds"],
        local_steps=cfg["local_steps"], batch_size=cfg["batch_size"],
        learning_rate=cfg["learning_rate"], eval_every=max(1, cfg["rounds"] // 5),
    ), "training (reviews)", ctx.isolate)
    rows, series = [], []
    for algorithm in REVIEWS_ALGORITHMS:
        summary = json.loads((run_dir / algorithm / "summary.json").read_text())
        personal = algorithm == "fedrep"
        key = "eval_personal_accuracy" if personal else "eval_accuracy"
        comm = max(1, summary["communication_rounds"])
        rows.append({
            "method": METHOD_NAMES[algorithm],
            "evaluated": ("each client's own model on its domain's test set" if personal
                          else "the global model on all domains' test sets"),
            "communication_rounds": summary["communication_rounds"],
            "final_accuracy": summary["final"].get(key),
            "best_accuracy": summary["best_personal_accuracy" if personal
                                     else "best_eval_accuracy"],
            "train_loss": summary["final"].get("train_loss"),
            "upload_kib": summary["upload_bytes_per_client_total"] / comm / 1024,
            "seconds": run_seconds(run_dir / algorithm),
        })
        x, y = eval_curve(run_dir / algorithm / "metrics.csv", key)
        series.append(Series(METHOD_NAMES[algorithm], x, y))
    backbone = ("all-MiniLM-L6-v2 (pretrained)" if cfg["backbone"] == "minilm"
                else "a random 2-layer, 64-wide BERT (`--backbone=tiny`)")
    title = (
        f"Five-domain review sentiment (airline, books, dvd, electronics, kitchen) as natural "
        f"non-IID clients, {cfg['num_clients']} clients (one per domain) all every round: "
        f"{backbone}, LoRA rank 4 on query and value, {cfg['sequence_length']} tokens, "
        f"{cfg['rounds']} communication rounds of {cfg['local_steps']} local SGD steps of batch "
        f"{cfg['batch_size']}, learning rate {cfg['learning_rate']:g}, seed {ctx.seed}. FedRep "
        f"trains its personal head for {cfg['head_epochs']} epochs of the round's batches, then "
        f"the adapters (B in odd, A in even communication rounds); test sets: each domain's "
        f"`test-labeled.tsv`. No paper reports this experiment.")
    notes = ["Accuracies are comparable: a global model's accuracy on the pooled test sets and "
             "the personalized accuracy (each client's model on its own domain, pooled over "
             "clients) are both over the same test examples."]
    columns = [
        Column("method", "method"), Column("evaluated", "evaluated"),
        Column("comm. rounds", "communication_rounds"),
        Column("test acc (final)", "final_accuracy", "{:.4f}"),
        Column("test acc (best)", "best_accuracy", "{:.4f}"),
        Column("train loss", "train_loss", "{:.4f}"),
        Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
        Column("training seconds", "seconds", "{:.0f}"),
    ]
    panels = [Panel(f"reviews, {cfg['num_clients']} clients ({cfg['backbone']})",
                    "communication round", "test accuracy", series)]
    return Result(Table(title, columns, rows, notes), panels,
                  "FedRep over RoLoRA adapters vs FedAvg-LoRA and RoLoRA on five review domains")


# ------------------------------------------------------------------------------------------------
# 11. reviews_domains


REVIEW_DOMAIN_NAMES = ("airline", "books", "dvd", "electronics", "kitchen")
# Global methods (one model, tested on every domain) and personalized ones (each domain its own
# head or B factors, tested on its own domain).
REVIEWS_DOMAIN_METHODS = {
    "rolora": (dict(algorithm="rolora"), False),
    "fedavg_lora": (dict(algorithm="fedavg_lora"), False),
    "ffa_lora": (dict(algorithm="ffa_lora"), False),
    "fedrep": (dict(algorithm="fedrep", representation="lora_alternating"), True),
    "fedsa_lora": (dict(algorithm="fedsa_lora"), True),
    "flute": (dict(algorithm="flute", representation="lora_alternating"), True),
}
REVIEWS_DOMAIN_LABELS = {**SST2_CLAIM_NAMES, "fedrep": "FedRep heads over RoLoRA adapters",
                         "flute": "FLUTE* heads (NC server step) over RoLoRA adapters"}
REVIEWS_DOMAIN_SCALES = {
    "small": dict(backbone="tiny", sequence_length=32, rounds=6, local_steps=5, batch_size=16,
                  learning_rate=0.5, head_epochs=2),
    "full": dict(backbone="minilm", sequence_length=64, rounds=100, local_steps=10,
                 batch_size=16, learning_rate=0.3, head_epochs=5, lora_layers="3,4,5",
                 evaluations=2),
}
# Full scale: 100 rounds give each client 1,000 sequential steps (16,000 reviews, 9.4 passes over
# its 1,700). At 40 rounds RoLoRA's pooled test accuracy was 0.64 halfway and its train loss
# still 0.67 at round 28 (docs/RESULTS.md): too early on the curve to compare methods. An
# evaluation (10,000 test reviews of 64 tokens through layers 3-5 of MiniLM) takes about 100 s
# on 2 cores, eight rounds' training: the table needs the final one only, so full scale
# evaluates at the middle and the end, not five times.


def _domains_config(ctx: Context, cfg: dict, run_dir, method: str, fields: dict) -> RunConfig:
    """The training run of one method of `reviews_domains` at scale `cfg`."""
    head = dict(head_epochs=cfg["head_epochs"]) if method in ("fedrep", "flute") else {}
    layers = dict(lora_layers=cfg["lora_layers"]) if cfg.get("lora_layers") else {}
    return RunConfig().with_changes(
        task="reviews", backbone=cfg["backbone"], sequence_length=cfg["sequence_length"],
        rank=4, lora_targets=("query", "value"), **layers, **fields, **head, num_clients=5,
        clients_per_round=5, rounds=cfg["rounds"], local_steps=cfg["local_steps"],
        batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"], eval_per_client=True,
        eval_every=max(1, cfg["rounds"] // cfg.get("evaluations", 5)), seed=ctx.seed,
        data_dir=str(ctx.data_dir), output_dir=str(run_dir))


def run_reviews_domains(ctx: Context) -> Result:
    need_data(ctx, "multidomain_sentiment")
    cfg = REVIEWS_DOMAIN_SCALES[ctx.scale]
    rows, series = [], []
    for method, (fields, personalized) in REVIEWS_DOMAIN_METHODS.items():
        if ctx.methods is not None and method not in ctx.methods:
            continue
        run_dir = ctx.output_dir / method
        config = _domains_config(ctx, cfg, run_dir, method, fields)
        summary = archive.train_once(
            run_dir, cfg["rounds"],
            None if ctx.collect else lambda resume, config=config, method=method: run_training(
                config.with_changes(resume=resume), f"training ({method}, reviews)",
                ctx.isolate),
            ctx.output_dir, ctx.archive_dir)
        if summary is None:  # --collect, not finished yet
            continue
        final = summary["final"]
        key = "eval_personal_accuracy" if personalized else "eval_accuracy"
        row = {"method": REVIEWS_DOMAIN_LABELS[method],
               "kind": "personalized" if personalized else "global",
               "pooled": final.get(key)}
        row.update({d: final.get(f"eval_{d}_accuracy") for d in REVIEW_DOMAIN_NAMES})
        comm = max(1, summary["communication_rounds"])
        row["upload_kib"] = summary["upload_bytes_per_client_total"] / comm / 1024
        rows.append(row)
        series.append(Series(REVIEWS_DOMAIN_LABELS[method], list(REVIEW_DOMAIN_NAMES),
                             [row[d] for d in REVIEW_DOMAIN_NAMES]))
    title = (
        f"Five review domains as natural clients (no paper ran it): one "
        f"client per domain, all every round, {cfg['backbone']} backbone, LoRA rank 4 on query "
        f"and value, {cfg['sequence_length']} tokens, {cfg['rounds']} communication rounds of "
        f"{cfg['local_steps']} local SGD steps of batch {cfg['batch_size']}, learning rate "
        f"{cfg['learning_rate']:g}, seed {ctx.seed}. Global methods: the one model on each "
        f"domain's test set; personalized ones: each domain's own model (FedRep and FLUTE heads "
        f"with {cfg['head_epochs']} head epochs, RoLoRA-alternated adapters; FedSA-LoRA's "
        f"personal B) on its own domain's test set (`test-labeled.tsv`, 2,000 per domain). "
        f"Final round.")
    columns = [Column("method", "method"), Column("kind", "kind"),
               *[Column(d, d, "{:.4f}") for d in REVIEW_DOMAIN_NAMES],
               Column("pooled", "pooled", "{:.4f}"),
               Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}")]
    notes = ["Pooled: the global model on all domains' test sets, or each domain's model on its "
             "own, pooled over the same 10,000 test examples: the two are comparable."]
    panels = [Panel(f"per-domain test accuracy ({cfg['backbone']}, {ctx.scale} scale)",
                    "domain", "test accuracy", series, kind="bar",
                    categories=REVIEW_DOMAIN_NAMES)]
    return Result(Table(title, columns, rows, notes), panels,
                  "Review domains: global vs personalized federated LoRA")
