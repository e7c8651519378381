"""`sst2_instruct` (issue 54, item 6): RoLoRA, FedAvg-LoRA and FFA-LoRA instruction-tune a decoder
on SST-2 as "Review: <text>\\nSentiment:" → " positive" / " negative", with N = 3 and N = 20 IID
clients, all of them every round.

Each (method, N) is one training run of `scripts/train.py --task=sst2_instruct`, kept and resumed
through `experiments.archive` (`--archive_dir`, `--resume`, `--collect`), as the review-domain
experiment's. The table reports, on the 872 dev sentences, the final generation accuracy (greedy
answer parsed by its first word, unparseable counted wrong: the RoLoRA paper's protocol), the
share of unparseable answers, the likelihood accuracy (the likelier of the two answers) and the
answer tokens' loss, with the upload per client and round.

Scales: `small` is the random byte-level GPT-2 (`--backbone=gpt2_tiny`, minutes, a smoke run of
the protocol); `full` is Gemma 3 270M (`--backbone=gemma3_270m`), its budget chosen from
`--estimate` on 2 cores (docs/RESULTS.md states it beside the table).
"""

from __future__ import annotations

from experiments import archive
from experiments.report import Column, Panel, Series, Table
from experiments.running import (Context, Result, eval_curve, need_data, run_seconds,
                                 run_training, train_config)

SST2_INSTRUCT_METHODS = ("rolora", "fedavg_lora", "ffa_lora")
SST2_INSTRUCT_LABELS = {"rolora": "RoLoRA", "fedavg_lora": "FedAvg-LoRA",
                        "ffa_lora": "FFA-LoRA"}
SST2_INSTRUCT_CLIENTS = (3, 20)
SST2_INSTRUCT_SCALES = {
    "small": dict(backbone="gpt2_tiny", rank=4, lora_layers=None, rounds=6, local_steps=2,
                  batch_size=8, learning_rate=0.5, evaluations=1),
    "full": dict(backbone="gemma3_270m", rank=8, lora_layers="14,15,16,17", rounds=30,
                 local_steps=2, batch_size=8, learning_rate=0.1, evaluations=1),
}
# Full scale: an evaluation of the 872 dev sentences through Gemma 3 270M (answer tokens,
# generation, both answers' likelihoods) took about 29 s per 40 sentences on the 2 shared cores,
# so about 10 min: the final round only. LoRA sits on the top 4 of 18 layers (the paper's
# budgets adapt the top quarter of RoBERTa-Large), so backpropagation stops at layer 14.


def _config(ctx: Context, cfg: dict, run_dir, method: str, num_clients: int):
    layers = dict(lora_layers=cfg["lora_layers"]) if cfg["lora_layers"] else {}
    return train_config(
        ctx, run_dir, task="sst2_instruct", backbone=cfg["backbone"], algorithm=(method,),
        rank=cfg["rank"], lora_targets=("query", "value"), **layers, num_clients=num_clients,
        clients_per_round=num_clients, rounds=cfg["rounds"], local_steps=cfg["local_steps"],
        batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
        eval_every=max(1, cfg["rounds"] // cfg["evaluations"]))


def _row(method: str, num_clients: int, summary: dict, run_dir) -> dict:
    final = summary["final"]
    comm = max(1, summary["communication_rounds"])
    return {"method": SST2_INSTRUCT_LABELS[method], "clients": num_clients,
            "generation_accuracy": final.get("eval_accuracy"),
            "unparseable": final.get("eval_unparseable"),
            "likelihood_accuracy": final.get("eval_likelihood_accuracy"),
            "answer_loss": final.get("eval_loss"),
            "upload_kib": summary["upload_bytes_per_client_total"] / comm / 1024,
            "seconds": run_seconds(run_dir)}


def run_sst2_instruct(ctx: Context) -> Result:
    """Trains (or collects) every (method, N) run and tabulates them."""
    need_data(ctx, "sst2")
    cfg = SST2_INSTRUCT_SCALES[ctx.scale]
    rows, series = [], []
    for num_clients in SST2_INSTRUCT_CLIENTS:
        for method in SST2_INSTRUCT_METHODS:
            if ctx.methods is not None and method not in ctx.methods:
                continue
            run_dir = ctx.output_dir / f"N{num_clients}" / method
            config = _config(ctx, cfg, run_dir, method, num_clients)
            what = f"training ({method}, N={num_clients}, {cfg['backbone']})"
            summary = archive.train_once(
                run_dir, cfg["rounds"],
                None if ctx.collect else lambda resume, config=config, what=what: run_training(
                    config.with_changes(resume=resume), what, ctx.isolate),
                ctx.output_dir, ctx.archive_dir)
            if summary is None:  # --collect, not finished yet
                continue
            rows.append(_row(method, num_clients, summary, run_dir))
            x, y = eval_curve(run_dir / "metrics.csv")
            series.append(Series(f"{SST2_INSTRUCT_LABELS[method]}, N={num_clients}", x, y))
    layers = f"layers {cfg['lora_layers']}" if cfg["lora_layers"] else "every layer"
    title = (
        f"SST-2 as instructions for a decoder (issue 54): {cfg['backbone']}, LoRA rank "
        f"{cfg['rank']} on query and value of {layers}, IID clients all every round, "
        f"{cfg['rounds']} communication rounds of {cfg['local_steps']} local SGD steps of batch "
        f"{cfg['batch_size']}, learning rate {cfg['learning_rate']:g}, seed {ctx.seed}; the 872 "
        f"dev sentences, final round.")
    columns = [Column("method", "method"), Column("N", "clients"),
               Column("generation acc", "generation_accuracy", "{:.4f}"),
               Column("unparseable", "unparseable", "{:.4f}"),
               Column("likelihood acc", "likelihood_accuracy", "{:.4f}"),
               Column("answer-token loss", "answer_loss", "{:.4f}"),
               Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
               Column("training seconds", "seconds", "{:.0f}")]
    notes = ["Generation: greedy decoding until end of text (at most the longer answer's "
             "tokens), the first word parsed; an answer naming neither class counts as wrong. "
             "Likelihood: the answer of higher log p(answer | prompt)."]
    panels = [Panel(f"dev generation accuracy ({cfg['backbone']})", "communication round",
                    "generation accuracy", series)]
    return Result(Table(title, columns, rows, notes), panels,
                  "Federated instruction tuning of a decoder on SST-2")
