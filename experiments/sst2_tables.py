"""The tables of the SST-2 protocol experiments (`experiments.sst2`): the main table and plot
(`claim_result`), each method's degradation as N grows (`degradation_rows`), the paper's claims
as verdicts (`table1_claims`, `table2_claims`, `runner.verdicts`) and the words that say
which classifier and regime the figures are about."""

from __future__ import annotations

from collections.abc import Sequence

from experiments.sst2_protocol import SST2_CLAIM_NAMES, SST2_CLAIM_SCALES, paper_mean
from runner import verdicts
from runner.report import Column, Panel, Series, Table
from runner.running import Context, Result, mean_std


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
            row[f"drop_{n}"] = mean_std(drops, "{:.2f}") if drops else None
            row[f"seeds_{n}"] = len(drops)
            row[f"per_seed_{n}"] = ", ".join(f"{s}: {d:.2f}" for s, d in zip(paired, drops))
            p0, p = paper_mean(key, first["clients"]), paper_mean(key, n)
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


TABLE1_CLAIM = ("Paper's claim (rolora.md §3.2, Table 1): RoLoRA degrades least as N grows "
                 "(94.80 at N = 50 against FedAvg-LoRA's 93.00); FFA-LoRA declines; FlexLoRA "
                 "collapses at N = 50.")
TABLE2_CLAIM = ("Paper's claim (rolora.md §3.2, NeurIPS Table 2: RoBERTa-Large on MNLI and QQP, "
                 "Dir(0.5) over 10 clients and Dir(1.0) over 15; no SST-2 figure, so no paper "
                 "column here): under label skew RoLoRA is the most accurate (MNLI, Dir(0.5): "
                 "82.60 against LoRA's 81.19, FFA-LoRA's 75.60 and FlexLoRA's 35.45; QQP: 84.16, "
                 "82.60, 81.47, 63.24) and FlexLoRA collapses.")


def _paper_difference(terms: Sequence[tuple[float, str, int]]) -> float | None:
    """Σ c·(the paper's Table 1 mean of method at N), rounded to 0.01; None if one is missing."""
    values = [paper_mean(method, n) for _, method, n in terms]
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
        "MNLI +1.41, QQP +1.56 (Dir(0.5), 10 clients; no SST-2 figure)",
        note="the paper's effect weighed: the smaller of its MNLI and QQP differences, +1.41",
        effect=1.41)]


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
                f"{cfg.get('sequence_length')}; now --pooling=pooler trains the "
                "pooler, so running them again is not this protocol.")
    return ("Corrected classifier: "
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
        + f". Learning rate per method from a dev-set grid {where} ("
        + ("mean dev accuracy of the last two evaluations" if cfg.get("select_on") == "last_two"
           else "final dev accuracy")
        + ", first seed; the `lr grid` column). Test accuracy: the labeled test split (1,821 "
        "sentences), final round, mean ± std over the seeds done (the sample std, ddof = 1). "
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


def mixed_commit_notes(rows: Sequence[dict]) -> list[str]:
    """One line per cell whose seeds ran at different commits (their summaries' `provenance`;
    a run from before that record counts as "unrecorded").

    >>> print(mixed_commit_notes([{"method": "RoLoRA", "clients": 3,
    ...                            "commits": {0: "a" * 40, 1: "b" * 40, 2: "b" * 40}},
    ...                           {"method": "FFA-LoRA", "clients": 3,
    ...                            "commits": {0: "c" * 40, 1: "c" * 40}}])[0])
    RoLoRA, N = 3: its seeds ran at different commits (seed 0: aaaaaaaaaaaa; seeds 1, 2: bbbbbbbbbbbb).
    """
    lines = []
    for r in rows:
        by_commit = {}
        for seed, commit in sorted(r.get("commits", {}).items()):
            by_commit.setdefault(commit[:12] if commit else "unrecorded", []).append(seed)
        if len(by_commit) > 1:
            parts = "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}: {c}"
                              for c, s in by_commit.items())
            lines.append(f"{r['method']}, N = {r['clients']}: its seeds ran at different "
                         f"commits ({parts}).")
    return lines


def rerun_notes(rows: Sequence[dict]) -> list[str]:
    """A line naming the runs whose test figure came from a rerun (rows' `reran`: "<cell>,
    seed <s> (dev <run's> → <rerun's>)"), or none.

    >>> rerun_notes([{"reran": ["RoLoRA, N = 3, seed 0 (dev 0.8463 → 0.8463)"]}])[0][-44:]
    'RoLoRA, N = 3, seed 0 (dev 0.8463 → 0.8463).'
    >>> rerun_notes([{"reran": []}])
    []
    """
    reran = [entry for r in rows for entry in r.get("reran", ())]
    if not reran:
        return []
    return ["Test figures from a rerun with the same flags and seed, the run having kept no "
            "checkpoint to evaluate (its summary.json's `rerun`), with the run's dev figure → "
            "the rerun's: " + "; ".join(reran) + "."]


def claim_result(ctx: Context, rows, setting: str, claim: str = TABLE1_CLAIM,
                       paper_column: bool = True, cfg: dict | None = None,
                       claims: Sequence[verdicts.Claim] = (),
                       averaging_column: bool = False) -> Result:
    """The main table (with the `averaging_column`: FedAvg-LoRA's mean averaging error), the
    plot, `drops` (with two N or more) and `claims` (the verdicts of `claims` whose cells ran)."""
    cfg = SST2_CLAIM_SCALES[ctx.scale] if cfg is None else cfg
    notes = [claim, _classifier_note(cfg)]
    notes += mixed_commit_notes(rows) + rerun_notes(rows)
    columns = [Column("clients", "clients"), Column("method", "method"),
               Column("lr", "learning_rate", "{:g}"), Column("comm. rounds", "rounds"),
               Column("seeds done", "seeds_done"), Column("test acc", "test_accuracy"),
               Column("dev acc", "dev_accuracy"),
               Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
               *([Column("averaging error (FedAvg-LoRA; mean over rounds, seeds)",
                         "averaging_error", "{:.4g}")] if averaging_column else []),
               Column("lr grid (dev acc, seed 0" + ("; mean of the last two evaluations)"
                      if cfg.get("select_on") == "last_two" else ")"), "grid"),
               Column("rates tried", "rates_tried"),
               Column("thin choice: runner-up lr", "runner_up", "{:g}"),
               *([Column("paper SST-2 acc % (RoBERTa-L)", "paper")] if paper_column else [])]
    extra = {}
    drops = _degradation_table(rows)
    if drops:
        extra["drops"] = drops
    if cfg.get("select_on") == "last_two":
        notes.append("Each cell's rate is chosen at seed 0 on the mean dev accuracy of its last "
                     "two evaluations (the final one alone where a run evaluated once).")
    thin = [f"{r['method']}, N = {r['clients']}: {r['thin']}" for r in rows if r.get("thin")]
    if thin:
        notes.append("Thin choices (a tie, a win by at most 4 dev sentences, or a rate at the "
                     "edge of those tried), whose runner-up rate also runs at every seed: "
                     + "; ".join(thin) + ".")
    verdict_table = verdicts.claims_table(claims, rows, _regime(cfg, rows), [
        "Claims whose methods did not run are left out. The differences are per seed, between "
        "runs of the same seed; each cell at its own chosen learning rate."])
    if verdict_table:
        extra["claims"] = verdict_table
    runner_rows = [r.get("runner_up_row", r) for r in rows]
    if any("runner_up_row" in r for r in rows):
        runner_table = verdicts.claims_table(
            claims, runner_rows, _regime(cfg, runner_rows),
            heading="Under the runner-up rates: the same claims with every thin cell at its "
                    "runner-up rate (the other cells at their chosen rate; a claim whose cells "
                    "are all at their chosen rate repeats its verdict above). ")
        if runner_table:
            extra["claims_runner_up"] = runner_table
    return Result(Table(_claim_title(cfg, rows, setting), columns, rows, notes),
                  _claim_panels(ctx, cfg, rows, setting), f"SST-2 {setting}: federated LoRA",
                  extra)


def iid_claims(rows: Sequence[dict]) -> list[verdicts.Claim]:
    clients = sorted({r["clients"] for r in rows if r["key"] != "centralized"})
    return table1_claims(clients[0], clients[-1]) if len(clients) > 1 else []
