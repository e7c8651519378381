"""`sst2_instruct`: RoLoRA, FedAvg-LoRA and FFA-LoRA instruction-tune a decoder on SST-2 as
"Review: <text>\\nSentiment:" → " positive" / " negative", with N = 3 and N = 20 IID clients, all of
them every round, beside the untuned decoder (the zero-shot row).

Each run is one training run of `scripts/train.py --task=sst2_instruct`, kept and resumed through
`runner.archive` (`--archive_dir`, `--resume`, `--collect`). At N = 3, each method's
learning rate is chosen on the dev split from a small grid (`learning_rates`) at the first seed
(the final evaluation's generation accuracy; of equals, the smallest rate), and the chosen rate
runs at every seed (`seeds`); the paired per-seed differences of the methods at N = 3 get their
verdicts (`runner.verdicts`). A thin choice (`experiments.sst2_protocol.thin_choice`: a tie, a win
by at most 4 dev sentences, or a rate at the grid's edge) also runs its runner-up rate at every
seed, after all the chosen cells, and the verdicts are read again with that cell at its
runner-up. At N = 20, one run per method at `learning_rate`. The zero-shot row evaluates the
model as every method starts it (LoRA's B = 0: the pretrained base), with the same prompts, the
same parsing and the same dev sentences (`runner.run.evaluate_untrained`). At full scale, RoLoRA's
run at N = 3, the first seed and the default rate runs again with its frozen base stored in
bfloat16 and again in int8 (`--base_dtype`), and a note for each says whether its dev
generation accuracy stays within `LOWER_BASE_POINTS` of the float32 run's (`_lower_base`).

The table reports, on the 872 dev sentences, the final generation accuracy (greedy answer parsed
by its first word, unparseable counted wrong: the RoLoRA paper's protocol), the share of
unparseable answers, the likelihood accuracy (the likelier of the two answers) and the answer
tokens' loss, with the upload per client and round. At N = 3 the runs also evaluate SST-2's
1,821 labeled test sentences (`--eval_test`): the table gives their generation accuracy, and the
claims are read on it, the dev split's interval beside (the dev split chose the rates). A run of
the claims' cells that finished without the test split gets it later (`_test_later`): from its
final state when the archive keeps one (`FINAL_STATES`), else from a rerun with the same flags.

Scales: `small` is the random byte-level GPT-2 (`--backbone=gpt2_tiny`, minutes, a smoke run of
the protocol); `full` is Gemma 3 270M (`--backbone=gemma3_270m`), its budget chosen from
`--estimate` on 2 cores (docs/RESULTS.md states it beside the table).
"""

from __future__ import annotations

import pathlib
import shutil

from experiments.sst2_protocol import claim_accuracy, rerun_note, runner_up, thin_choice
from experiments.sst2_tables import mixed_commit_notes, rerun_notes
from runner import archive, verdicts
from runner.estimate import active_probes
from runner.report import Column, Panel, Series, Table
from runner.running import (
    Context,
    Result,
    eval_curve,
    mean_of,
    mean_std,
    need_data,
    run_seconds,
    run_training,
    train_config,
)

SST2_INSTRUCT_METHODS = ("rolora", "fedavg_lora", "ffa_lora")
SST2_INSTRUCT_LABELS = {"rolora": "RoLoRA", "fedavg_lora": "FedAvg-LoRA",
                        "ffa_lora": "FFA-LoRA", "zero_shot": "untuned (zero-shot)"}
SST2_INSTRUCT_CLIENTS = (3, 20)
# Under --archive_dir: the final checkpoints of runs that kept one, at their run's path (e.g.
# final_states/N3/rolora_seed1_lr0.3/round_000030/), so that a finished run can be evaluated
# again (`_test_later`).
FINAL_STATES = "final_states"
# The N whose cells have a rate grid and several seeds, and their claims.
SST2_INSTRUCT_SEEDED = 3
SST2_INSTRUCT_SCALES = {
    "small": dict(backbone="gpt2_tiny", rank=4, lora_layers=None, rounds=6, local_steps=2,
                  batch_size=8, learning_rate=0.5, learning_rates=(0.5,), seeds=1,
                  evaluations=1, lower_bases=()),
    "full": dict(backbone="gemma3_270m", rank=8, lora_layers="14,15,16,17", rounds=30,
                 local_steps=2, batch_size=8, learning_rate=0.1, learning_rates=(0.03, 0.1, 0.3),
                 seeds=3, evaluations=1, lower_bases=("bfloat16", "int8")),
}
# The lower-precision base's check (`_lower_base`): its dev generation accuracy within this many
# points of the float32 base's, the rest of the run the same.
LOWER_BASE_POINTS = 1.0
# Full scale: an evaluation of the 872 dev sentences through Gemma 3 270M (answer tokens,
# generation, both answers' likelihoods) took about 29 s per 40 sentences on the 2 shared cores,
# so about 10 min: the final round only. LoRA sits on the top 4 of 18 layers (the paper's
# budgets adapt the top quarter of RoBERTa-Large), so backpropagation stops at layer 14.


def _config(ctx: Context, cfg: dict, run_dir, method: str, num_clients: int, seed: int,
            learning_rate: float):
    layers = dict(lora_layers=cfg["lora_layers"]) if cfg["lora_layers"] else {}
    return train_config(
        ctx, run_dir, task="sst2_instruct", backbone=cfg["backbone"], algorithm=(method,),
        rank=cfg["rank"], lora_targets=("query", "value"), **layers, num_clients=num_clients,
        clients_per_round=num_clients, rounds=cfg["rounds"], local_steps=cfg["local_steps"],
        batch_size=cfg["batch_size"], learning_rate=learning_rate,
        eval_every=max(1, cfg["rounds"] // cfg["evaluations"]),
        eval_test=num_clients == SST2_INSTRUCT_SEEDED).with_changes(seed=seed)


def _run_dir(ctx: Context, cfg: dict, method: str, num_clients: int, seed: int,
             learning_rate: float) -> pathlib.Path:
    """`N<n>/<method>` for the first seed at `learning_rate` (the layout the first runs were
    archived in), `N<n>/<method>_seed<s>_lr<r>` for the others."""
    if seed == ctx.seed and learning_rate == cfg["learning_rate"]:
        return ctx.output_dir / f"N{num_clients}" / method
    return ctx.output_dir / f"N{num_clients}" / f"{method}_seed{seed}_lr{learning_rate:g}"


def _summary(ctx: Context, cfg: dict, method: str, num_clients: int, seed: int,
             learning_rate: float, with_test: bool = False) -> tuple[dict | None, pathlib.Path]:
    """The run's summary (training it unless --collect; None if unfinished) and its folder;
    `with_test` (a run of the claims' cells): with the test split's figures, evaluated later
    for a run finished without them (`_test_later`)."""
    run_dir = _run_dir(ctx, cfg, method, num_clients, seed, learning_rate)
    config = _config(ctx, cfg, run_dir, method, num_clients, seed, learning_rate)
    what = (f"training ({method}, N={num_clients}, seed {seed}, lr {learning_rate:g}, "
            f"{cfg['backbone']})")
    summary = _trained(ctx, cfg, run_dir, config, what)
    if (summary is not None and with_test and config.output.eval_test and not ctx.collect
            and active_probes() is None and _test_figure(summary) is None):
        summary = _test_later(ctx, cfg, config, run_dir, what)
    return summary, run_dir


def _trained(ctx: Context, cfg: dict, run_dir: pathlib.Path, config, what: str) -> dict | None:
    """The summary of the run `config` in `run_dir`: found (here or archived), else trained
    unless --collect (`archive.train_once`); None if unfinished."""
    return archive.train_once(
        run_dir, cfg["rounds"],
        None if ctx.collect else lambda resume: run_training(
            config.with_changes(resume=resume), what, ctx.isolate),
        ctx.output_dir, ctx.archive_dir)


def _test_figure(summary: dict) -> float | None:
    """The run's test generation accuracy: its own, or its rerun's (`archive.attach_rerun`)."""
    return claim_accuracy(summary, "eval_test_accuracy")


def _test_later(ctx: Context, cfg: dict, config, run_dir: pathlib.Path, what: str) -> dict:
    """The test split's measures for a finished run that did not evaluate it (trained before
    --eval_test was set here): its final state, when the archive keeps one under
    `final_states/<run>/` (`FINAL_STATES`), evaluated with train.py --evaluate_only (the dev
    measures recomputed beside, `evaluated_later` in summary.json); else the run again with the
    same flags in `<run>_rerun/`, attached to it (`archive.attach_rerun`). Returns the run's
    summary, archived."""
    archived = None if ctx.archive_dir is None else (
        ctx.archive_dir / run_dir.relative_to(ctx.output_dir))
    state = None if ctx.archive_dir is None else _newest_state(
        ctx.archive_dir / FINAL_STATES / run_dir.relative_to(ctx.output_dir))
    if state is not None:
        shutil.copytree(state, run_dir / archive.CHECKPOINTS / state.name, dirs_exist_ok=True)
        run_training(config.with_changes(evaluate_only=True),
                     what.replace("training", "evaluating", 1), ctx.isolate)
    else:
        rerun_dir = run_dir.with_name(run_dir.name + "_rerun")
        rerun = archive.train_once(
            rerun_dir, cfg["rounds"], lambda resume: run_training(
                config.with_changes(output_dir=str(rerun_dir), resume=resume),
                f"{what} again, for its test split", ctx.isolate),
            ctx.output_dir, ctx.archive_dir)
        if rerun is None:
            raise RuntimeError(f"{rerun_dir}: the rerun did not finish")
        archive.attach_rerun(run_dir, rerun_dir)
    if archived is not None:
        archive.keep(run_dir, cfg["rounds"], archived)
    return archive.finished_summary(run_dir, cfg["rounds"])


def _newest_state(folder: pathlib.Path) -> pathlib.Path | None:
    """The newest checkpoint folder (`round_xxxxxx/`) in `folder`, or None."""
    from tffl.simulation import checkpoint

    found = checkpoint.latest(folder)
    return None if found is None else found[1]


def _zero_shot(ctx: Context, cfg: dict) -> dict | None:
    """The untuned decoder's evaluation (a run of 0 rounds; with the test split, evaluated
    again when it was evaluated before the test split was), or None with --collect before it
    ran (and under --estimate, which times training runs only)."""
    from runner import run

    if active_probes() is not None:
        return None
    run_dir = ctx.output_dir / "zero_shot"
    config = _config(ctx, cfg, run_dir, SST2_INSTRUCT_METHODS[0], SST2_INSTRUCT_SEEDED,
                     ctx.seed, cfg["learning_rate"])
    evaluate = None if ctx.collect else lambda resume: run.evaluate_untrained(
        config.with_changes(resume=False))
    summary = archive.train_once(run_dir, 0, evaluate, ctx.output_dir, ctx.archive_dir)
    if summary is not None and evaluate is not None and "eval_test_accuracy" not in summary[
            "final"]:   # evaluated before the test split was: again, with it (nothing trains)
        evaluate(False)
        if ctx.archive_dir is not None:
            archive.keep(run_dir, 0, ctx.archive_dir / run_dir.relative_to(ctx.output_dir))
        summary = archive.finished_summary(run_dir, 0)
    return summary


def _lower_base(ctx: Context, cfg: dict, dtype: str) -> tuple[dict, str] | None:
    """RoLoRA at N = 3, the first seed and the default rate, its frozen base stored at
    `dtype` (one of `cfg["lower_bases"]`: `--base_dtype`; LoRA factors and arithmetic float32), in
    `N3/rolora_base_<dtype>`: its table row, and the note comparing its dev generation accuracy
    with the float32 run of the same flags (`N3/rolora`, trained by the grid). None before both
    finished."""
    n, lr = SST2_INSTRUCT_SEEDED, cfg["learning_rate"]
    run_dir = ctx.output_dir / f"N{n}" / f"rolora_base_{dtype}"
    config = _config(ctx, cfg, run_dir, "rolora", n, ctx.seed, lr).with_changes(base_dtype=dtype)
    what = (f"training (rolora, N={n}, seed {ctx.seed}, lr {lr:g}, {cfg['backbone']}, "
            f"{dtype} base)")
    summary = _trained(ctx, cfg, run_dir, config, what)
    reference, _ = _summary(ctx, cfg, "rolora", n, ctx.seed, lr)
    if summary is None or reference is None:
        return None
    low, wide = summary["final"]["eval_accuracy"], reference["final"]["eval_accuracy"]
    points = 100 * (low - wide)
    verdict = "within" if abs(points) <= LOWER_BASE_POINTS else "not within"
    note = (f"Base precision: RoLoRA at N = {n}, seed {ctx.seed}, lr {lr:g} with its frozen base "
            f"stored in {dtype} (--base_dtype={dtype}; LoRA factors and arithmetic in float32): "
            f"dev generation accuracy {low:.4f} against {wide:.4f} with the float32 base, "
            f"{points:+.2f} points: {verdict} {LOWER_BASE_POINTS:g} point of it (one seed, the "
            "same data order: the effect of the rounding, not a claim).")
    return _row(f"RoLoRA, {dtype} base", n, [summary], [run_dir], learning_rate=lr,
                seeds_done="1/1"), note


def _four_places(value) -> str:
    """A measure of one run (a number) to 4 places; of several, already "mean ± std" (`_row`).

    >>> _four_places(0.84633), _four_places("0.8100 ± 0.0141")
    ('0.8463', '0.8100 ± 0.0141')
    """
    return value if isinstance(value, str) else f"{value:.4f}"


def _row(label: str, num_clients, summaries: list[dict], run_dirs, **extra) -> dict:
    finals = [s["final"] for s in summaries]

    def measure(key):
        values = [f.get(key) for f in finals if f.get(key) is not None]
        if not values:
            return None
        return values[0] if len(values) == 1 else mean_std(values, "{:.4f}")

    comm = max(1, summaries[0]["communication_rounds"])
    return {"method": label, "clients": num_clients,
            "generation_accuracy": measure("eval_accuracy"),
            "test_generation_accuracy": measure("eval_test_accuracy"),
            "unparseable": measure("eval_unparseable"),
            "likelihood_accuracy": measure("eval_likelihood_accuracy"),
            "answer_loss": measure("eval_loss"),
            "upload_kib": summaries[0]["upload_bytes_per_client_total"] / comm / 1024,
            "seconds": mean_of([run_seconds(d) for d in run_dirs]), **extra}


def _seeded_row(ctx: Context, cfg: dict, method: str, num_clients: int, lr: float, grid: dict,
                cells: list, extra: dict) -> dict:
    """The table row of `method` at `num_clients` and rate `lr` over the scale's seeds (one seed
    off the seeded N), training (or finding) the seeds after the first; appends the cell
    (`runner.verdicts`' {seed: dev generation accuracy}) to `cells`. `grid`: {rate: (summary,
    run folder)} of the first seed, `lr` among them; `extra` overrides the row's keys."""
    seeds = [ctx.seed + s for s in range(cfg["seeds"])]
    seeded = num_clients == SST2_INSTRUCT_SEEDED
    runs = ([_summary(ctx, cfg, method, num_clients, s, lr, with_test=True) for s in seeds]
            if seeded else [grid[lr]])
    finished = [(s, d) for s, d in runs if s is not None]
    by_seed = {seed: s["final"].get("eval_accuracy")
               for seed, (s, _) in zip(seeds, runs) if s is not None}
    cells.append({"key": method, "clients": num_clients, "by_seed_dev": by_seed,
                  "by_seed_test": {seed: _test_figure(s)
                                   for seed, (s, _) in zip(seeds, runs) if s is not None}})
    commits = {seed: s.get("provenance", {}).get("commit")
               for seed, (s, _) in zip(seeds, runs) if s is not None}
    tests = [_test_figure(s) for s, _ in finished]
    reran = [f"{extra.get('method', SST2_INSTRUCT_LABELS[method])}, N = {num_clients}, seed {seed}"
             + (f" ({note})" if note else "")
             for seed, (s, _) in zip(seeds, runs) if s is not None
             for note in [rerun_note(s, "eval_test_accuracy")] if note is not None]
    return _row(SST2_INSTRUCT_LABELS[method], num_clients, [s for s, _ in finished],
                [d for _, d in finished], learning_rate=lr, commits=commits, reran=reran,
                test_generation_accuracy=(
                    None if not tests or None in tests else
                    tests[0] if len(tests) == 1 else mean_std(tests, "{:.4f}")),
                seeds_done=f"{len(finished)}/{len(runs)}",
                grid=", ".join(f"{r:g}: {s['final'].get('eval_accuracy', 0.0):.4f}"
                               for r, (s, _) in sorted(grid.items())) if len(grid) > 1 else None,
                **extra)


def _with_measure(cells: list[dict]) -> list[dict]:
    """The claims' cells on one measure: the test generation accuracy when every finished run
    of every cell at the seeded N (the claims') has it, else the dev's; the dev's beside it
    (`by_seed_dev`)."""
    on_test = all(v is not None for c in cells if c["clients"] == SST2_INSTRUCT_SEEDED
                  for v in c["by_seed_test"].values())
    split = "test" if on_test else "dev"
    return [c | {"by_seed": c["by_seed_test" if on_test else "by_seed_dev"],
                 "measure": f"{split} generation"} for c in cells]


def _claims(methods) -> list[verdicts.Claim]:
    """The paired differences of RoLoRA and each other method at the seeded N."""
    n = SST2_INSTRUCT_SEEDED
    return [verdicts.Claim(label, f"RoLoRA above {SST2_INSTRUCT_LABELS[other]}",
                           f"RoLoRA − {SST2_INSTRUCT_LABELS[other]} at N = {n}",
                           ((1, "rolora", n), (-1, other, n)))
            for label, other in (("(i)", "fedavg_lora"), ("(ii)", "ffa_lora"))
            if "rolora" in methods and other in methods]


def run_sst2_instruct(ctx: Context) -> Result:
    """Trains (or collects) every run and tabulates them (module docstring)."""
    need_data(ctx, "sst2")
    cfg = SST2_INSTRUCT_SCALES[ctx.scale]
    methods = [m for m in SST2_INSTRUCT_METHODS if ctx.methods is None or m in ctx.methods]
    seeds = [ctx.seed + s for s in range(cfg["seeds"])]
    rows, series, cells = [], [], []
    zero = _zero_shot(ctx, cfg) if ctx.methods is None or "zero_shot" in ctx.methods else None
    if zero is not None:
        rows.append(_row(SST2_INSTRUCT_LABELS["zero_shot"], "–", [zero],
                         [ctx.output_dir / "zero_shot"], learning_rate=None, seeds_done="–"))
    runner_ups = {}   # method -> (the runner-up rate of a thin choice at the seeded N, why)
    for num_clients in SST2_INSTRUCT_CLIENTS:
        for method in methods:
            seeded = num_clients == SST2_INSTRUCT_SEEDED
            rates = sorted(cfg["learning_rates"]) if seeded else [cfg["learning_rate"]]
            grid = {lr: _summary(ctx, cfg, method, num_clients, seeds[0], lr) for lr in rates}
            done = {lr: s for lr, (s, _) in grid.items() if s is not None}
            if len(done) < len(rates):   # the grid is not finished: no choice yet
                continue
            scores = {lr: done[lr]["final"].get("eval_accuracy", 0.0) for lr in rates}
            chosen = max(rates, key=scores.get)
            why = thin_choice(scores) if seeded else None
            if why is not None:
                runner_ups[method] = (runner_up(scores), why)
            rows.append(_seeded_row(ctx, cfg, method, num_clients, chosen, grid, cells, {
                "runner_up": runner_up(scores) if why is not None else None}))
            x, y = eval_curve(grid[chosen][1] / "metrics.csv")
            series.append(Series(f"{SST2_INSTRUCT_LABELS[method]}, N={num_clients}", x, y))
    runner_cells = [c for c in cells if (c["key"], c["clients"]) not in
                    {(m, SST2_INSTRUCT_SEEDED) for m in runner_ups}]
    for method, (lr, _) in runner_ups.items():   # after every chosen cell: the runner-ups
        grid = {lr: _summary(ctx, cfg, method, SST2_INSTRUCT_SEEDED, seeds[0], lr)}
        rows.append(_seeded_row(ctx, cfg, method, SST2_INSTRUCT_SEEDED, lr, grid, runner_cells,
                                {"method": f"{SST2_INSTRUCT_LABELS[method]} (runner-up)"}))
    lower = [found for found in (_lower_base(ctx, cfg, dtype) for dtype in cfg["lower_bases"]
                                 if "rolora" in methods) if found is not None]
    rows += [row for row, _ in lower]
    layers = f"layers {cfg['lora_layers']}" if cfg["lora_layers"] else "every layer"
    title = (
        f"SST-2 as instructions for a decoder: {cfg['backbone']}, LoRA rank "
        f"{cfg['rank']} on query and value of {layers}, IID clients all every round, "
        f"{cfg['rounds']} communication rounds of {cfg['local_steps']} local SGD steps of batch "
        f"{cfg['batch_size']}; at N = {SST2_INSTRUCT_SEEDED}, each method's learning rate "
        f"chosen from {', '.join(f'{r:g}' for r in sorted(cfg['learning_rates']))} on the dev "
        f"generation accuracy at seed {ctx.seed}, then run at {cfg['seeds']} seed(s) (mean ± "
        f"std, ddof = 1); at N = 20, learning rate {cfg['learning_rate']:g}, seed {ctx.seed}; "
        "the 872 dev sentences, final round.")
    columns = [Column("method", "method"), Column("N", "clients"),
               Column("lr", "learning_rate", "{:g}"), Column("seeds done", "seeds_done"),
               Column("generation acc", "generation_accuracy", _four_places),
               Column("test generation acc", "test_generation_accuracy", _four_places),
               Column("unparseable", "unparseable", _four_places),
               Column("likelihood acc", "likelihood_accuracy", _four_places),
               Column("answer-token loss", "answer_loss", _four_places),
               Column("lr grid (generation acc, first seed)", "grid"),
               Column("thin choice: runner-up lr", "runner_up", "{:g}"),
               Column("upload KiB/client/comm. round", "upload_kib", "{:.1f}"),
               Column("training seconds", "seconds", "{:.0f}")]
    notes = ["Generation: greedy decoding until end of text (at most the longer answer's "
             "tokens), the first word parsed; an answer naming neither class counts as wrong. "
             "Likelihood: the answer of higher log p(answer | prompt). The zero-shot row is "
             "the decoder before any training (LoRA's B = 0), on the same prompts and parsing."]
    panels = [Panel(f"dev generation accuracy ({cfg['backbone']})", "communication round",
                    "generation accuracy", series)]
    extra = {}
    regime = (f"Regime: {cfg['backbone']}, {cfg['rounds']} rounds at N = {SST2_INSTRUCT_SEEDED}; "
              "the measure is the generation accuracy on SST-2's labeled test split where every "
              "run of the claims has it (else on the dev split, which also chose the rates), the "
              "dev split's beside it.")
    claims = verdicts.claims_table(_claims(methods), _with_measure(cells), regime)
    if claims is not None:
        extra["claims"] = claims
    notes += mixed_commit_notes(rows) + rerun_notes(rows) + [note for _, note in lower]
    if runner_ups:
        notes.append("Thin choices (a tie, a win by at most 4 dev sentences, or a rate at the "
                     "edge of those tried), whose runner-up rate also runs at every seed: "
                     + "; ".join(f"{SST2_INSTRUCT_LABELS[m]}: {why}"
                                 for m, (_, why) in runner_ups.items()) + ".")
        claims = verdicts.claims_table(_claims(methods), _with_measure(runner_cells), regime,
                                       heading=(
            "Under the runner-up rates: the same claims with every thin cell at its runner-up "
            "rate (the other cells at their chosen rate). "))
        if claims is not None:
            extra["claims_runner_up"] = claims
    return Result(Table(title, columns, rows, notes), panels,
                  "Federated instruction tuning of a decoder on SST-2", extra)
