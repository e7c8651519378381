"""runner/estimate: --estimate's probes, and what it counts of runs already finished or
stopped in --archive_dir (or, with --resume, in --output_dir). Training is replaced by a fake
train.py that writes a probe's metrics.csv; the predicted times are checked against
`Probe.predicted_seconds`' formula worked by hand."""

import json
import pathlib

import pytest

from runner import archive, estimate, report, running

# A probe's metrics: 4 rounds (the first 5 s with compile, then 1 s each), evaluated after
# rounds 2 and 4 (3 s, then 2 s): t_round = 1, t_eval = 2, compile extra 4, first evaluation
# extra 1, startup wall − 8 − 5.
PROBE_METRICS = "round,round_seconds,evaluation_seconds\n1,5.0,\n2,1.0,3.0\n3,1.0,\n4,1.0,2.0\n"


def _finished(folder: pathlib.Path, rounds: int) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"rounds_completed": rounds}))
    (folder / "metrics.csv").write_text("round\n")


def _stopped(folder: pathlib.Path, at_round: int) -> None:
    checkpoint = folder / archive.CHECKPOINTS / f"round_{at_round:06d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text("{}")
    (folder / archive.CHECKPOINTS / f"round_{at_round + 1:06d}").mkdir()  # incomplete: skipped


def _files(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def probed(monkeypatch):
    """The probe configurations trained, in order; each writes PROBE_METRICS in every
    algorithm's folder."""
    from runner import run

    configs = []

    def fake_train(config, what, isolate):
        configs.append(config)
        for _, folder in run.run_folders(config):
            folder.mkdir(parents=True)
            (folder / "metrics.csv").write_text(PROBE_METRICS)

    monkeypatch.setattr(running, "_train", fake_train)
    return configs


def _three_runs(ctx):
    """An experiment of three runs of one algorithm, 100 rounds evaluated every 20: a, b, c."""
    for name in ("a", "b", "c"):
        config = running.train_config(ctx, ctx.output_dir / name, rounds=100, eval_every=20,
                                      algorithm=["rolora"])
        running.run_training(config, f"run {name}", ctx.isolate)


def test_finished_runs_count_nothing_and_stopped_ones_their_remaining_rounds(
        tmp_path, probed):
    """In the archive a finished and b stopped at round 40 (its newest complete checkpoint):
    a is not probed, b predicts its 60 remaining rounds and 3 remaining evaluations (rounds 60,
    80, 100), c all 100 rounds and 5 evaluations; the archive is only read."""
    kept = tmp_path / "archive"
    _finished(kept / "a", 100)
    _stopped(kept / "b", 40)
    before = _files(kept)
    lines = []
    ctx = running.Context("x", "small", tmp_path / "out", resume=False, seed=0,
                          data_dir=tmp_path, log=lines.append, archive_dir=kept)
    total = estimate.estimate_experiment(ctx, _three_runs)
    assert [pathlib.Path(c.output.output_dir).name for c in probed] == ["b", "c"]
    assert all(c.algorithm.rounds == 4 and not c.output.resume for c in probed)
    # startup (−13 + wall ≈ 0) + compile 4 + first evaluation 1 + rounds·1 + evaluations·2.
    remaining_b, all_c = -8 + 60 + 3 * 2, -8 + 100 + 5 * 2
    assert total == pytest.approx(remaining_b + all_c, abs=1)
    assert lines[1] == "  run a: finished"
    assert lines[2].startswith("  run b: 60 of 100 rounds and 3 of 5 evaluations (resumes at "
                               "round 40): ")
    assert lines[3].startswith("  run c: 100 rounds, 5 evaluations: ")
    assert lines[4].startswith(f"  total: {total / 3600:.2f} h; 1 of 3 runs finished in {kept}")
    assert _files(kept) == before
    assert estimate.active_probes() is None


def test_with_resume_the_output_dirs_own_runs_count_too(tmp_path, probed):
    """Without an archive, --resume counts --output_dir's runs (there: a finished, c stopped at
    round 80); without --resume nothing is counted and every run is probed."""
    out = tmp_path / "out"
    _finished(out / "a", 100)
    _stopped(out / "c", 80)
    lines = []
    ctx = running.Context("x", "small", out, resume=True, seed=0, data_dir=tmp_path,
                          log=lines.append)
    total = estimate.estimate_experiment(ctx, _three_runs)
    assert [pathlib.Path(c.output.output_dir).name for c in probed] == ["b", "c"]
    assert total == pytest.approx((-8 + 100 + 5 * 2) + (-8 + 20 + 1 * 2), abs=1)
    assert "1 of 3 runs finished" in lines[-1]
    probed.clear()
    lines.clear()
    fresh = estimate.estimate_experiment(
        running.Context("x", "small", out, resume=False, seed=0, data_dir=tmp_path,
                        log=lines.append), _three_runs)
    assert len(probed) == 3 and fresh == pytest.approx(3 * (-8 + 100 + 5 * 2), abs=1)
    assert lines[-1] == f"  total: {fresh / 3600:.2f} h"


def test_a_finished_runs_files_are_there_for_the_experiment_to_read(tmp_path, probed):
    """An experiment that reads a run's metrics.csv after training it (srpfl_mnist) reads, for
    a run finished in the resumed --output_dir, that run's own file, copied into the probe
    folder; the real folder is left as it was."""
    out = tmp_path / "out"
    _finished(out / "a", 100)
    (out / "a" / "metrics.csv").write_text("round,accuracy\n100,0.9\n")
    before = _files(out)
    read = {}

    def runner(ctx):
        for name in ("a", "b"):
            config = running.train_config(ctx, ctx.output_dir / name, rounds=100, eval_every=20,
                                          algorithm=["rolora"])
            running.run_training(config, f"run {name}", ctx.isolate)
            read[name] = report.read_csv(ctx.output_dir / name / "metrics.csv")

    estimate.estimate_experiment(running.Context(
        "x", "small", out, resume=True, seed=0, data_dir=tmp_path, log=lambda line: None), runner)
    assert read["a"] == [{"round": "100", "accuracy": "0.9"}] and len(read["b"]) == 4
    assert {k: v for k, v in _files(out).items() if not k.startswith("estimate/")} == before


def test_each_algorithm_of_a_comparison_run_counts_from_its_own_progress(tmp_path, probed):
    """A run comparing two algorithms keeps each in a folder of its own: rolora finished in
    the archive, fedavg_lora stopped at round 60; one probe is trained for both, fedavg_lora
    counts its last 40 rounds and 2 evaluations, rolora nothing."""
    kept = tmp_path / "archive"
    _finished(kept / "r" / "rolora", 100)
    _stopped(kept / "r" / "fedavg_lora", 60)
    lines = []

    def runner(ctx):
        config = running.train_config(ctx, ctx.output_dir / "r", rounds=100, eval_every=20,
                                      algorithm=["rolora", "fedavg_lora"])
        running.run_training(config, "run r", ctx.isolate)

    total = estimate.estimate_experiment(running.Context(
        "x", "small", tmp_path / "out", resume=False, seed=0, data_dir=tmp_path,
        log=lines.append, archive_dir=kept), runner)
    assert len(probed) == 1
    assert lines[1].startswith("  run r: fedavg_lora: 40 of 100 rounds and 2 of 5 evaluations "
                               "(resumes at round 60): ")
    assert lines[2] == "  run r: rolora: finished"
    assert total == pytest.approx(-8 + 40 + 2 * 2, abs=1)


def test_progress_finds_a_finished_run_and_an_invocations_resume_round(tmp_path):
    """`archive.progress` over the folders in an invocation's order: a finished run anywhere wins;
    else the last folder with a checkpoint gives the round (the run folder's own over the
    archive's, as `archive.restore` has it); a summary of fewer rounds is not a finished
    run."""
    first, second = tmp_path / "first", tmp_path / "second"
    _stopped(first / "r", 50)
    _stopped(second / "r", 30)
    relative = pathlib.Path("r")
    assert archive.progress([first, second], relative, 100) == (None, 30)
    assert archive.progress([second, first], relative, 100) == (None, 50)
    (second / "r" / "summary.json").write_text(json.dumps({"rounds_completed": 50}))
    assert archive.progress([first, second], relative, 100) == (None, 30)
    _finished(first / "done", 100)
    assert archive.progress([second, first], pathlib.Path("done"), 100) == (first / "done", 100)
    stray = second / "r" / archive.CHECKPOINTS / "round_old"
    stray.mkdir()
    (stray / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=r"round_old: not a checkpoint folder"):
        archive.progress([second], relative, 100)
