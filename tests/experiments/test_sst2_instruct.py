"""experiments/sst2_instruct over resumed invocations: the runs it makes (one per method and
N, the decoder task, all clients every round), --methods, --archive_dir and --collect, with the
training runs replaced by a recorder of their RunConfigs that writes the summary a finished run
would."""

import json
import pathlib

import pytest

from experiments import sst2_instruct
from runner import report, running


def _fake_train(configs):
    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        configs.append(config)
        run_dir.mkdir(parents=True, exist_ok=True)
        accuracy = {"rolora": 0.8, "ffa_lora": 0.7}[config.algorithm.algorithm[0]]
        (run_dir / "metrics.csv").write_text(
            f"round,communication_rounds,eval_accuracy\n6,6,{accuracy}\n")
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": accuracy, "eval_likelihood_accuracy": accuracy + 0.1,
                      "eval_unparseable": 0.05, "eval_loss": 0.5,
                      **({"eval_test_accuracy": accuracy - 0.01}
                         if config.output.eval_test else {})}}))
    return fake_train


def test_runs_archive_and_collect(tmp_path, monkeypatch):
    configs = []
    monkeypatch.setattr(sst2_instruct, "run_training", _fake_train(configs))
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)
    archive = tmp_path / "archive"

    def rows(output_dir, **kw):
        ctx = running.Context("sst2_instruct", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora", "ffa_lora"), **kw)
        return sst2_instruct.run_sst2_instruct(ctx).table.rows

    first = rows(tmp_path / "first", archive_dir=archive)
    assert [(c.algorithm.algorithm, c.task.num_clients, c.participation.clients_per_round)
            for c in configs] == [(("rolora",), 3, 3), (("ffa_lora",), 3, 3),
                                  (("rolora",), 20, 20), (("ffa_lora",), 20, 20)]
    assert {(c.task.task, c.model.backbone) for c in configs} == {("sst2_instruct", "gpt2_tiny")}
    assert [(r["method"], r["clients"], r["generation_accuracy"], r["likelihood_accuracy"],
             r["upload_kib"]) for r in first] == [
        ("RoLoRA", 3, 0.8, 0.9, 2.0), ("FFA-LoRA", 3, 0.7, 0.7 + 0.1, 2.0),
        ("RoLoRA", 20, 0.8, 0.9, 2.0), ("FFA-LoRA", 20, 0.7, 0.7 + 0.1, 2.0)]
    configs.clear()
    assert rows(tmp_path / "fresh", archive_dir=archive) == first and configs == []
    assert rows(tmp_path / "empty", collect=True) == [] and configs == []


def test_rates_from_a_dev_grid_seeds_at_the_chosen_rate_zero_shot_and_paired_verdicts(
        tmp_path, monkeypatch):
    """A scale with a grid (0.1, 0.3) and 2 seeds: at N = 3 each method runs both rates at the
    first seed and its best (by the final generation accuracy) at the second; N = 20 runs the
    default rate once. The zero-shot row is the untrained evaluation; the claims pair the
    methods' seeds: RoLoRA − FFA-LoRA = (0.80 − 0.70, 0.82 − 0.71) = (+10, +11) points."""
    from runner import run

    cfg = dict(sst2_instruct.SST2_INSTRUCT_SCALES["small"], learning_rates=(0.1, 0.3),
               learning_rate=0.1, seeds=2)
    monkeypatch.setitem(sst2_instruct.SST2_INSTRUCT_SCALES, "small", cfg)
    final = {("rolora", 0.1, 0): 0.75, ("rolora", 0.3, 0): 0.80, ("rolora", 0.3, 1): 0.82,
             ("ffa_lora", 0.1, 0): 0.70, ("ffa_lora", 0.3, 0): 0.60, ("ffa_lora", 0.1, 1): 0.71}
    trained = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        method, lr, seed = (config.algorithm.algorithm[0], config.algorithm.learning_rate,
                            config.algorithm.seed)
        trained.append((method, config.task.num_clients, lr, seed))
        accuracy = final.get((method, lr, seed), 0.5)
        run_dir.mkdir(parents=True, exist_ok=True)
        # RoLoRA's seed 1 at another commit than its seed 0; the other cells at one.
        commit = "b" * 40 if (method, seed) == ("rolora", 1) else "a" * 40
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy + 0.02},
            "provenance": {"commit": commit}}))

    def fake_untrained(config):
        path = pathlib.Path(config.output.output_dir)
        path.mkdir(parents=True, exist_ok=True)
        summary = {"rounds_completed": 0, "communication_rounds": 0,
                   "upload_bytes_per_client_total": 0,
                   "final": {"eval_accuracy": 0.55, "eval_test_accuracy": 0.56}}
        (path / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(sst2_instruct, "run_training", fake_train)
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)
    monkeypatch.setattr(run, "evaluate_untrained", fake_untrained)
    ctx = running.Context("sst2_instruct", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path)
    result = sst2_instruct.run_sst2_instruct(ctx)
    assert trained == [
        ("rolora", 3, 0.1, 0), ("rolora", 3, 0.3, 0), ("rolora", 3, 0.3, 1),
        ("fedavg_lora", 3, 0.1, 0), ("fedavg_lora", 3, 0.3, 0), ("fedavg_lora", 3, 0.1, 1),
        ("ffa_lora", 3, 0.1, 0), ("ffa_lora", 3, 0.3, 0), ("ffa_lora", 3, 0.1, 1),
        ("rolora", 20, 0.1, 0), ("fedavg_lora", 20, 0.1, 0), ("ffa_lora", 20, 0.1, 0),
        # Every choice of a two-rate grid is at its edge, so thin: the runner-ups' other seed.
        ("rolora", 3, 0.1, 1), ("fedavg_lora", 3, 0.3, 1), ("ffa_lora", 3, 0.3, 1)]
    rows = {(r["method"], r["clients"]): r for r in result.table.rows}
    assert rows[("untuned (zero-shot)", "–")]["generation_accuracy"] == 0.55
    assert rows[("RoLoRA", 3)]["learning_rate"] == 0.3
    assert rows[("RoLoRA", 3)]["generation_accuracy"] == "0.8100 ± 0.0141"
    # The table as --collect writes it: one run's measures and several seeds' side by side.
    table = report.markdown_table(result.table.columns, result.table.rows)
    assert "| 0.5500 |" in table and "| 0.8100 ± 0.0141 |" in table
    assert rows[("FFA-LoRA", 3)]["grid"] == "0.1: 0.7000, 0.3: 0.6000"
    claims = {r["claim"][:4]: r for r in result.extra_tables["claims"].rows}
    assert claims["(ii)"]["per_seed"] == "0: +10.00, 1: +11.00"
    assert claims["(ii)"]["mean"] == pytest.approx(10.5)
    # On the test split (every run has it), the dev split's interval beside it.
    assert claims["(ii)"]["measure"] == "test generation"
    assert claims["(ii)"]["dev_mean"] == pytest.approx(10.5)
    assert rows[("RoLoRA", 3)]["test_generation_accuracy"] == "0.8300 ± 0.0141"
    assert rows[("untuned (zero-shot)", "–")]["test_generation_accuracy"] == 0.56
    # Under the runner-up rates: RoLoRA at 0.1 (0.75, 0.5) against FFA-LoRA's runner-up 0.3
    # (0.60, 0.5): +15 and 0 points.
    assert rows[("RoLoRA (runner-up)", 3)]["learning_rate"] == 0.1
    assert rows[("RoLoRA", 3)]["runner_up"] == 0.1 and rows[("RoLoRA", 20)]["runner_up"] is None
    assert rows[("RoLoRA (runner-up)", 3)]["generation_accuracy"] == "0.6250 ± 0.1768"
    runner = {r["claim"][:4]: r for r in result.extra_tables["claims_runner_up"].rows}
    assert runner["(ii)"]["per_seed"] == "0: +15.00, 1: +0.00"
    assert any("RoLoRA: at the edge of the rates tried" in note for note in result.table.notes)
    # --collect names each cell whose seeds ran at different commits, and only those.
    mixed = [note for note in result.table.notes if "different commits" in note]
    line = "{}, N = 3: its seeds ran at different commits (seed 0: {}; seed 1: {})."
    assert mixed == [line.format(method, "a" * 12, "b" * 12)
                     for method in ("RoLoRA", "RoLoRA (runner-up)")]


def test_a_clear_choice_inside_the_grid_runs_no_runner_up(tmp_path, monkeypatch):
    """A grid of three rates whose middle one wins by 87 dev sentences (0.1 of 872): not thin,
    so no runner-up runs and there is no second verdict table."""
    cfg = dict(sst2_instruct.SST2_INSTRUCT_SCALES["small"], learning_rates=(0.1, 0.3, 1.0),
               learning_rate=0.3, seeds=2)
    monkeypatch.setitem(sst2_instruct.SST2_INSTRUCT_SCALES, "small", cfg)
    trained = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        lr = config.algorithm.learning_rate
        trained.append((config.task.num_clients, lr, config.algorithm.seed))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": 0.8 if lr == 0.3 else 0.7, "eval_test_accuracy": 0.75}}))

    monkeypatch.setattr(sst2_instruct, "run_training", fake_train)
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)
    ctx = running.Context("sst2_instruct", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",))
    result = sst2_instruct.run_sst2_instruct(ctx)
    assert trained == [(3, 0.1, 0), (3, 0.3, 0), (3, 1.0, 0), (3, 0.3, 1), (20, 0.3, 0)]
    assert [r["runner_up"] for r in result.table.rows] == [None, None]
    assert "claims_runner_up" not in result.extra_tables


def test_runs_finished_without_the_test_split_are_evaluated_from_their_final_state_or_rerun(
        tmp_path, monkeypatch):
    """Archived N = 3 runs trained before --eval_test: one whose final state the archive keeps
    (final_states/N3/rolora/round_000006/) is evaluated from it with --evaluate_only --eval_test;
    one without is run again with the same flags in N3/ffa_lora_rerun/ and attached to it. The
    claims are then read on the test split (RoLoRA − FFA-LoRA = 0.79 − 0.66 = +13 points; on dev
    0.80 − 0.70), a later invocation trains nothing, and --collect reads the same."""
    from runner import archive as archive_lib

    archive = tmp_path / "archive"
    dev = {"rolora": 0.8, "ffa_lora": 0.7}
    for n, method in [(n, m) for n in (3, 20) for m in dev]:
        folder = archive / f"N{n}" / method
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({
            "rounds_completed": 6, "communication_rounds": 6, "flags": {"seed": 0},
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": dev[method]}}))
    state = archive / "final_states" / "N3" / "rolora" / "round_000006"
    state.mkdir(parents=True)
    (state / "meta.json").write_text("{}")
    calls = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        calls.append((run_dir.relative_to(tmp_path / "out"), config.output.evaluate_only,
                      config.output.eval_test))
        if config.output.evaluate_only:   # what train.py --evaluate_only adds
            assert (run_dir / "checkpoints" / "round_000006" / "meta.json").exists()
            summary = json.loads((run_dir / "summary.json").read_text())
            summary["final"]["eval_test_accuracy"] = 0.79
            summary["evaluated_later"] = {"added": ["eval_test_accuracy"]}
        else:   # the rerun, with the test split
            summary = {"rounds_completed": 6, "communication_rounds": 6,
                       "flags": {"seed": 0, "eval_test": True},
                       "upload_bytes_per_client_total": 6 * 2048,
                       "final": {"eval_accuracy": 0.7, "eval_test_accuracy": 0.66}}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(summary))

    monkeypatch.setattr(sst2_instruct, "run_training", fake_train)
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)

    def result(output_dir, **kw):
        ctx = running.Context("sst2_instruct", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora", "ffa_lora"),
                              archive_dir=archive, **kw)
        return sst2_instruct.run_sst2_instruct(ctx)

    first = result(tmp_path / "out")
    assert calls == [(pathlib.Path("N3/rolora"), True, True),
                     (pathlib.Path("N3/ffa_lora_rerun"), False, True)]
    kept = json.loads((archive / "N3" / "rolora" / "summary.json").read_text())
    assert kept["final"] == {"eval_accuracy": 0.8, "eval_test_accuracy": 0.79}
    attached = json.loads((archive / "N3" / "ffa_lora" / "summary.json").read_text())
    assert attached["final"] == {"eval_accuracy": 0.7}   # the run's own figures stay
    assert attached[archive_lib.RERUN]["final"]["eval_test_accuracy"] == 0.66
    assert state.exists()   # the final state stays archived
    (claim,) = first.extra_tables["claims"].rows
    assert claim["measure"] == "test generation" and claim["per_seed"] == "0: +13.00"
    assert claim["dev_mean"] == pytest.approx(10.0)
    (note,) = [n for n in first.table.notes if "from a rerun" in n]
    assert note.endswith("the rerun's: FFA-LoRA, N = 3, seed 0 (dev 0.7000 → 0.7000).")
    calls.clear()
    again = result(tmp_path / "again")
    collected = result(tmp_path / "collected", collect=True)
    assert calls == []
    for other in (again, collected):
        assert other.extra_tables["claims"].rows == first.extra_tables["claims"].rows
        assert other.table.rows == first.table.rows


def test_the_lower_precision_base_reruns_rolora_and_says_whether_it_is_within_a_point(
        tmp_path, monkeypatch):
    """With `lower_bases`, RoLoRA's run at N = 3, seed 0 and the default rate runs again with
    --base_dtype, once per precision (its other flags the same), and a note compares each dev
    accuracy with float32's: 0.8463 against 0.8394 is −0.69 points, within 1; 0.8302 would be
    −1.61, not within."""
    cfg = dict(sst2_instruct.SST2_INSTRUCT_SCALES["small"], lower_bases=("bfloat16", "int8"))
    monkeypatch.setitem(sst2_instruct.SST2_INSTRUCT_SCALES, "small", cfg)
    configs, low = [], {"accuracy": 0.8394}

    def fake_train(config, what, isolate=False):
        configs.append(config)
        run_dir = pathlib.Path(config.output.output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        accuracy = {"bfloat16": low["accuracy"], "int8": 0.8475}.get(config.model.base_dtype,
                                                                      0.8463)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 2048,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy}}))

    monkeypatch.setattr(sst2_instruct, "run_training", fake_train)
    monkeypatch.setattr(sst2_instruct, "need_data", lambda ctx, name: None)

    def run(output_dir):
        ctx = running.Context("sst2_instruct", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora",))
        return sst2_instruct.run_sst2_instruct(ctx)

    result = run(tmp_path / "within")
    lower = [c for c in configs if c.model.base_dtype == "bfloat16"]
    assert len(lower) == 1 and lower[0].output.output_dir.endswith("N3/rolora_base_bfloat16")
    reference = next(c for c in configs if c.output.output_dir.endswith("N3/rolora"))
    assert lower[0].with_changes(base_dtype="float32", output_dir=".") == (
        reference.with_changes(output_dir="."))
    int8 = [c for c in configs if c.model.base_dtype == "int8"]
    assert len(int8) == 1 and int8[0].output.output_dir.endswith("N3/rolora_base_int8")
    rows = result.table.rows[-2:]
    assert [(r["method"], r["clients"], r["generation_accuracy"]) for r in rows] == [
        ("RoLoRA, bfloat16 base", 3, 0.8394), ("RoLoRA, int8 base", 3, 0.8475)]
    notes = [n for n in result.table.notes if n.startswith("Base precision")]
    assert "0.8394 against 0.8463 with the float32 base, -0.69 points: within 1 point" in notes[0]
    assert "stored in int8" in notes[1] and "+0.12 points: within 1 point" in notes[1]
    low["accuracy"] = 0.8302
    notes = [n for n in run(tmp_path / "outside").table.notes if n.startswith("Base precision")]
    assert "-1.61 points: not within 1 point" in notes[0]
