"""experiments/sst2_protocol's run order, learning-rate grids and archive, with the training
runs (`running.run_training`) replaced by a recorder of their RunConfigs that writes the summary
a finished run would (no training: the order is what is under test)."""

import json
import pathlib
import shutil

import numpy as np
import pytest

from experiments import sst2_protocol
from runner import estimate, running


def _value(config, flag):
    """The run's field `flag` as its command-line text (lists comma-separated)."""
    value = config.get(flag)
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def test_each_method_runs_its_grid_then_its_first_seed_at_every_n_before_other_seeds(
        tmp_path, monkeypatch):
    """... and the centralized run comes right after FedAvg-LoRA, the pair that decides
    whether the budget is large enough."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3), seeds=2,
               clients=(3, 20))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    monkeypatch.setattr(sst2_protocol, "SST2_CLAIM_METHODS",
                        {m: sst2_protocol.SST2_CLAIM_METHODS[m]
                         for m in ("rolora", "fedavg_lora", "ffa_lora")})
    runs = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(_value(config, "output_dir"))
        method, n, seed, lr = run_dir.relative_to(tmp_path).parts[:4]
        runs.append((method, n, seed, lr))
        rounds = int(_value(config, "rounds"))
        accuracy = 0.8 if lr == "lr0.3" else 0.6  # 0.3 wins every grid
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": rounds, "communication_rounds": rounds,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy + 0.01}}))

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=False, seed=0,
                          data_dir=tmp_path)
    rows, chosen, _ = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], True)
    grid = [("lr0.1",), ("lr0.3",)]
    expected = []
    for method, ns in (("rolora", ("N3", "N20")), ("fedavg_lora", ("N3", "N20")),
                       ("centralized", ("N1",)), ("ffa_lora", ("N3", "N20"))):
        expected += [(method, ns[0], "seed0") + lr for lr in grid]      # the grid
        expected += [(method, n, "seed0", "lr0.3") for n in ns[1:]]      # seed 0, other N
    for method, ns in (("rolora", ("N3", "N20")), ("fedavg_lora", ("N3", "N20")),
                       ("centralized", ("N1",)), ("ffa_lora", ("N3", "N20"))):
        expected += [(method, n, "seed1", "lr0.3") for n in ns]          # then seed 1
    assert runs == expected
    assert set(chosen.values()) == {0.3}
    assert {r["seeds_done"] for r in rows} == {"2/2"}
    assert {r["test_accuracy"] for r in rows} == {"0.8100 ± 0.0000"}


def _fake_train(tmp_path, runs):
    """A train.py that records its run and writes the summary a finished run would."""
    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(_value(config, "output_dir"))
        runs.append(run_dir.relative_to(run_dir.parents[3]).parts)
        rounds = int(_value(config, "rounds"))
        accuracy = 0.8 if _value(config, "learning_rate") == "0.3" else 0.6
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.csv").write_text(f"round\n{rounds}\n")
        (run_dir / "checkpoints").mkdir()
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": rounds, "communication_rounds": rounds,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy + 0.01}}))
    return fake_train


@pytest.mark.parametrize("grid_every_n", [False, True])
def test_methods_filter_largest_n_first_and_archive_restores_without_running(
        tmp_path, monkeypatch, grid_every_n):
    """--methods runs only the named methods; after the grid the first seed goes to the largest
    N first (with grid_every_n, the grid at every N); finished runs are archived (summary.json,
    metrics.csv, no checkpoints), and a fresh output folder with the same archive re-runs
    nothing and gives the same table."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3), seeds=1,
               clients=(3, 20, 50), grid_every_n=grid_every_n)
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    runs = []
    monkeypatch.setattr(sst2_protocol, "run_training", _fake_train(tmp_path, runs))
    archive = tmp_path / "archive"

    def protocol(output_dir):
        ctx = running.Context("sst2_clients", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("flora",), archive_dir=archive)
        return sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], True)

    rows, chosen, _ = protocol(tmp_path / "first")
    if grid_every_n:
        expected = [("flora", n, "seed0", lr) for n in ("N3", "N50", "N20")
                    for lr in ("lr0.1", "lr0.3")]
        grid = "0.1: 0.6000, 0.3: 0.8000"
        assert [r["grid"] for r in rows] == [grid, grid, grid]
    else:
        expected = [("flora", "N3", "seed0", "lr0.1"), ("flora", "N3", "seed0", "lr0.3"),
                    ("flora", "N50", "seed0", "lr0.3"), ("flora", "N20", "seed0", "lr0.3")]
        assert [r["grid"] for r in rows] == ["0.1: 0.6000, 0.3: 0.8000", None, None]
    assert runs == expected
    assert chosen == {("flora", 3): 0.3, ("flora", 20): 0.3, ("flora", 50): 0.3}
    assert [r["clients"] for r in rows] == [3, 20, 50]
    kept = sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*") if p.is_file())
    assert kept == sorted(f"flora/{n}/seed0/{lr}/{f}" for _, n, _, lr in expected
                          for f in ("metrics.csv", "summary.json"))
    runs.clear()
    again, _, _ = protocol(tmp_path / "fresh_checkout")
    assert runs == [] and again == rows
    # An unfinished archived copy is not taken for a finished run: it runs again.
    summary = archive / "flora/N20/seed0/lr0.3/summary.json"
    summary.write_text(json.dumps(dict(json.loads(summary.read_text()), rounds_completed=0)))
    protocol(tmp_path / "third")
    assert runs == [("flora", "N20", "seed0", "lr0.3")]


def test_a_stopped_run_keeps_its_newest_checkpoint_in_the_archive_and_resumes_from_it(
        tmp_path, monkeypatch):
    """An invocation stopped mid-run (here: train.py fails after checkpointing rounds 2 and 3) keeps
    the run's newest checkpoint and metrics in the archive; on a fresh output folder the run is
    resumed from it (--resume); once finished, the archive keeps no checkpoint."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=1, clients=(3,))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    calls = []
    finish = _fake_train(tmp_path, [])

    def stopped_train(config, what, isolate=False):
        calls.append(config)
        run_dir = pathlib.Path(_value(config, "output_dir"))
        for r in (2, 3):
            (run_dir / "checkpoints" / f"round_{r:06d}").mkdir(parents=True)
            (run_dir / "checkpoints" / f"round_{r:06d}" / "meta.json").write_text(str(r))
        (run_dir / "checkpoints" / "round_000004").mkdir()  # incomplete: no meta.json
        (run_dir / "metrics.csv").write_text("round\n1\n2\n3\n")
        raise running.StepError("train.py was stopped")

    archive = tmp_path / "archive"

    def protocol(output_dir):
        ctx = running.Context("sst2_clients", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora",), archive_dir=archive)
        return sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], False)

    monkeypatch.setattr(sst2_protocol, "run_training", stopped_train)
    with pytest.raises(running.StepError):
        protocol(tmp_path / "first")
    kept = archive / "rolora/N3/seed0/lr0.3"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "checkpoints/round_000003/meta.json", "metrics.csv"]

    def resumed_train(config, what, isolate=False):
        calls.append(config)
        run_dir = pathlib.Path(_value(config, "output_dir"))
        assert (run_dir / "checkpoints/round_000003/meta.json").read_text() == "3"
        assert (run_dir / "metrics.csv").read_text() == "round\n1\n2\n3\n"
        shutil.rmtree(run_dir)
        finish(config, what)

    monkeypatch.setattr(sst2_protocol, "run_training", resumed_train)
    rows, _, _ = protocol(tmp_path / "fresh_checkout")
    assert not calls[0].output.resume and calls[1].output.resume
    assert rows[0]["seeds_done"] == "1/1"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "metrics.csv", "summary.json"]


def _train_to_accuracy(monkeypatch, accuracy_of):
    """Replaces train.py by runs that end at dev and test accuracy `accuracy_of(lr)`; returns
    the list the runs' folder names are appended to, in order."""
    runs = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(_value(config, "output_dir"))
        runs.append(run_dir.name)
        accuracy = accuracy_of(float(_value(config, "learning_rate")))
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(config, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy}}))

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)
    return runs


@pytest.mark.parametrize("best, ran", [
    (0.3, ["lr0.1", "lr0.3", "lr1"]),                    # inside the grid: no edge rate
    (3.0, ["lr0.1", "lr0.3", "lr1", "lr3"]),             # at the top edge: 3.0, now inside
    (10.0, ["lr0.1", "lr0.3", "lr1", "lr3"]),            # still at the edge: none left above
    (0.01, ["lr0.1", "lr0.3", "lr1", "lr0.03", "lr0.01"]),  # at the bottom: 0.03, then 0.01
])
def test_a_best_rate_at_the_grids_edge_brings_in_the_next_rate_beyond_it(
        tmp_path, monkeypatch, best, ran):
    """Dev accuracy peaks at `best` (falls with |log(lr / best)|); the grid 0.1, 0.3, 1.0 is
    extended by the edge rates beyond the edge where its best sits, nearest first, until the
    best is inside or none is left; the chosen rate is the best of all that ran."""
    import math
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3, 1.0), seeds=1,
               clients=(3,), edge_rates=(0.01, 0.03, 3.0))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    runs = _train_to_accuracy(monkeypatch, lambda lr: 0.9 - 0.05 * abs(math.log(lr / best)))
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",))
    rows, chosen, grids = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], False)
    assert runs == ran
    expected = min((float(r[2:]) for r in ran), key=lambda r: abs(math.log(r / best)))
    assert chosen == {("rolora", 3): expected}
    assert list(grids[("rolora", 3)]) == sorted(float(r[2:]) for r in ran)
    assert rows[0]["learning_rate"] == expected


def test_a_tie_goes_to_the_smaller_rate_and_brings_in_no_edge_rate(tmp_path, monkeypatch):
    """FlexLoRA under label skew (seed 0) ended lr 0.3 and lr 1.0 at the same dev accuracy,
    702 of 872 sentences: the smaller rate, inside the grid, is chosen, and lr 3.0 does not
    run."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3, 1.0), seeds=1,
               clients=(3,), edge_rates=(0.03, 3.0))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    dev = {0.1: 647 / 872, 0.3: 702 / 872, 1.0: 702 / 872}
    runs = _train_to_accuracy(monkeypatch, dev.get)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("flexlora",))
    rows, chosen, _ = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], False)
    assert runs == ["lr0.1", "lr0.3", "lr1"]
    assert chosen == {("flexlora", 3): 0.3} and rows[0]["learning_rate"] == 0.3


def test_a_damaged_archived_summary_is_one_error_naming_the_file(tmp_path, monkeypatch):
    """A summary.json in the archive that is not JSON stops the experiment with a ValueError
    (reproduce.py: one line) that names the file, instead of a JSON traceback."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=1, clients=(3,))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    monkeypatch.setattr(sst2_protocol, "run_training", _fake_train(tmp_path, []))
    damaged = tmp_path / "archive/rolora/N3/seed0/lr0.3/summary.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"rounds_completed": 6,')  # cut short
    ctx = running.Context("sst2_clients", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",), archive_dir=tmp_path / "archive")
    with pytest.raises(ValueError, match=str(damaged)):
        sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], False)


def test_estimate_reads_the_archive_as_an_invocation_would(tmp_path, monkeypatch):
    """--estimate with --archive_dir: the seed-0 grid finished there (lr 0.3 best) is not probed
    and decides the rate of seeds 1 and 2, stopped at rounds 2 and 4 of 6: one probe is
    trained (seed 1's), and each seed counts its own remaining rounds and evaluations (every
    round); the archive and the output folder outside estimate/ are only read."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3), seeds=3,
               clients=(3,))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    kept = tmp_path / "archive"
    for lr, accuracy in (("lr0.1", 0.6), ("lr0.3", 0.8)):
        folder = kept / "rolora/N3/seed0" / lr
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({
            "rounds_completed": 6, "communication_rounds": 6, "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy}}))
    for seed, at_round in ((1, 2), (2, 4)):
        checkpoint = kept / f"rolora/N3/seed{seed}/lr0.3/checkpoints/round_{at_round:06d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "meta.json").write_text("{}")
    before = sorted(p.as_posix() for p in kept.rglob("*"))
    probes = []

    def fake_train(config, what, isolate):
        probes.append(pathlib.Path(config.output.output_dir).relative_to(tmp_path / "out"))
        folder = pathlib.Path(config.output.output_dir)
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(
            "round,round_seconds,evaluation_seconds\n1,5.0,\n2,1.0,3.0\n3,1.0,\n4,1.0,2.0\n")

    monkeypatch.setattr(running, "_train", fake_train)
    lines = []
    ctx = running.Context("sst2_clients", "small", tmp_path / "out", resume=False, seed=0,
                          data_dir=tmp_path, methods=("rolora",), archive_dir=kept,
                          log=lines.append)
    total = estimate.estimate_experiment(ctx, lambda c: sst2_protocol.run_protocol(
        c, {"partition": "iid"}, cfg["clients"], False))
    assert probes == [pathlib.Path("estimate/rolora/N3/seed1/lr0.3")]
    assert lines[1:3] == ["  training (rolora, N=3, seed 0, lr 0.1): finished",
                          "  training (rolora, N=3, seed 0, lr 0.3): finished"]
    assert lines[3].startswith("  training (rolora, N=3, seed 1, lr 0.3): 4 of 6 rounds and 4 "
                               "of 6 evaluations (resumes at round 2): ")
    assert lines[4].startswith("  training (rolora, N=3, seed 2, lr 0.3): 2 of 6 rounds and 2 "
                               "of 6 evaluations (resumes at round 4): ")
    # Each: startup −13 + compile 4 + first evaluation 1 (+ wall ≈ 0) + rounds·1 +
    # evaluations·2: seed 1 −8 + 4 + 8, seed 2 −8 + 2 + 4.
    assert total == pytest.approx(4 + (-2), abs=1)
    assert "2 of 4 runs finished" in lines[5]
    assert sorted(p.as_posix() for p in kept.rglob("*")) == before
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["estimate"]


def test_the_mean_of_the_last_two_evaluations_chooses_and_a_thin_choice_runs_its_runner_up(
        tmp_path, monkeypatch):
    """select_on="last_two": lr 0.3 ends at 0.845 but its last two evaluations average 0.835,
    lr 1.0 ends at 0.840 averaging 0.841: lr 1.0 is chosen (the final alone would pick 0.3),
    by (0.841 − 0.835)·872 = 5.2 dev sentences: not thin, but at the grid's top edge, with no
    edge rate beyond it: thin, so its runner-up lr 0.3 also runs at seeds 1 and 2, after the
    chosen rate's seeds."""
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3, 1.0), seeds=3,
               clients=(3,), select_on="last_two", runner_up=True)
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    curves = {0.1: (0.70, 0.71), 0.3: (0.825, 0.845), 1.0: (0.842, 0.840)}
    runs = []

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(_value(config, "output_dir"))
        runs.append(run_dir.relative_to(tmp_path).parts[2:])
        lr, rounds = float(_value(config, "learning_rate")), int(_value(config, "rounds"))
        before, last = curves[lr]
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.csv").write_text(
            f"round,eval_accuracy\n1,0.5\n{rounds - 1},{before}\n{rounds},{last}\n")
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": rounds, "communication_rounds": rounds,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": last, "eval_test_accuracy": last}}))

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",))
    rows, chosen, grids = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, (3,), False)
    assert chosen == {("rolora", 3): 1.0}
    assert grids[("rolora", 3)] == {0.1: pytest.approx(0.705), 0.3: pytest.approx(0.835),
                                    1.0: pytest.approx(0.841)}
    assert runs == [("seed0", "lr0.1"), ("seed0", "lr0.3"), ("seed0", "lr1"),
                    ("seed1", "lr1"), ("seed2", "lr1"), ("seed1", "lr0.3"), ("seed2", "lr0.3")]
    (row,) = rows
    assert (row["rates_tried"], row["runner_up"], row["thin"]) == (
        3, 0.3, "at the edge of the rates tried")
    assert row["runner_up_row"]["learning_rate"] == 0.3
    assert row["runner_up_row"]["by_seed"] == {0: 0.845, 1: 0.845, 2: 0.845}


def test_a_runs_predictions_give_the_cells_per_example_correctness(tmp_path):
    from tffl.simulation.predictions import PredictionLog

    log = PredictionLog()
    log.sink("test")(np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0]))
    log.save(tmp_path, round_num=30)
    correct = sst2_protocol.final_correct(tmp_path, 30)
    assert correct["test"].tolist() == [True, False, True, False]
    assert sst2_protocol.final_correct(tmp_path, 29) is None
