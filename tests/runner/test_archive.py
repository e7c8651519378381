"""runner.archive: which copy of a finished run wins when the output folder and the archive
both hold one; a rerun recorded beside a finished run (`attach_rerun`)."""

import json
import os

import pytest

from runner import archive, machine


def _finished(folder, marker, mtime):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"rounds_completed": 5, "marker": marker}))
    (folder / "metrics.csv").write_text(f"round,marker\n5,{marker}\n")
    os.utime(folder / "summary.json", (mtime, mtime))


def test_a_stale_output_copy_never_overwrites_a_newer_archived_run(tmp_path):
    """An output folder left from an earlier invocation (--collect's, say) holds an older
    summary.json than the archive, whose copy was re-evaluated since: the archive keeps its
    own, and it is the run's: copied into the output folder and returned (a --collect into an
    old output folder reads what the archive holds now)."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _finished(out / "r", "stale", 1_000)
    _finished(kept / "r", "re-evaluated", 2_000)
    assert archive.train_once(out / "r", 5, None, out, kept)["marker"] == "re-evaluated"
    for folder in (kept, out):
        assert json.loads((folder / "r" / "summary.json").read_text())["marker"] == (
            "re-evaluated")
        assert "re-evaluated" in (folder / "r" / "metrics.csv").read_text()


def test_a_newer_output_copy_replaces_the_archived_run(tmp_path):
    """The run re-evaluated in its output folder (train.py --evaluate_only) after it was
    archived: the newer summary.json and its metrics go to the archive."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _finished(kept / "r", "archived", 1_000)
    _finished(out / "r", "re-evaluated", 2_000)
    archive.train_once(out / "r", 5, None, out, kept)
    assert json.loads((kept / "r" / "summary.json").read_text())["marker"] == "re-evaluated"
    assert "re-evaluated" in (kept / "r" / "metrics.csv").read_text()


def test_a_stopped_runs_legs_travel_with_its_checkpoint(tmp_path):
    """An invocation stops a run: its newest checkpoint, metrics and legs record go to the
    archive; a fresh checkout restores all three before the next invocation resumes."""
    out, kept = tmp_path / "out", tmp_path / "kept"

    def stopped(resume):
        assert not resume
        (out / "r" / "checkpoints" / "round_000034").mkdir(parents=True)
        (out / "r" / "checkpoints" / "round_000034" / "meta.json").write_text("{}")
        (out / "r" / "metrics.csv").write_text("round\n34\n")
        machine.record_leg(out / "r", 1, {"cpu": "first machine"})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        archive.train_once(out / "r", 75, stopped, out, kept)
    assert sorted(p.name for p in (kept / "r").iterdir()) == sorted([
        "checkpoints", "metrics.csv", machine.LEGS_FILE])
    fresh = tmp_path / "fresh"
    resumed = []

    def resume(resume):
        resumed.append(resume)
        assert [s["machine"]["cpu"] for s in machine.read_legs(fresh / "r")] == [
            "first machine"]

    assert archive.train_once(fresh / "r", 75, resume, fresh, kept) is None
    assert resumed == [True] and (fresh / "r" / "metrics.csv").read_text() == "round\n34\n"


def _summary(folder, final, flags, rounds=5, metrics="round\n5\n"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(
        {"rounds_completed": rounds, "final": final, "flags": flags}))
    (folder / "metrics.csv").write_text(metrics)


def test_attach_rerun_keeps_the_runs_figures_and_records_the_reruns(tmp_path):
    """A rerun (same flags) is recorded under `rerun` with its final metrics and the largest
    |difference| of the numeric metrics both hold; the run's own final and metrics are
    untouched; the rerun's metrics.csv is kept as metrics_rerun.csv."""
    flags = {"seed": 0, "learning_rate": 0.3}
    own = {"eval_personal_accuracy": 0.8234, "train_loss": 0.2139, "round": 5}
    again = {"eval_personal_accuracy": 0.8211, "train_loss": 0.2150, "round": 5,
             "eval_personal_test_accuracy": 0.8342}
    _summary(tmp_path / "run", own, flags, metrics="round,train_loss\n5,0.2139\n")
    _summary(tmp_path / "rerun", again, flags, metrics="round,train_loss\n5,0.2150\n")
    rerun_summary = json.loads((tmp_path / "rerun" / "summary.json").read_text())
    rerun_summary["machine"] = {"cpu": "another CPU", "cpu_features": ["avx2"]}
    (tmp_path / "rerun" / "summary.json").write_text(json.dumps(rerun_summary))
    summary = archive.attach_rerun(tmp_path / "run", tmp_path / "rerun")
    stored = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert stored == summary and stored["final"] == own
    assert stored["rerun"]["final"] == again
    assert stored["rerun"]["machine"] == {"cpu": "another CPU", "cpu_features": ["avx2"]}
    assert stored["rerun"]["max_abs_difference_of_shared_metrics"] == max(
        abs(0.8234 - 0.8211), abs(0.2139 - 0.2150), 0)
    assert (tmp_path / "run" / "metrics_rerun.csv").read_text() == "round,train_loss\n5,0.2150\n"
    assert (tmp_path / "run" / "metrics.csv").read_text() == "round,train_loss\n5,0.2139\n"


def test_attach_rerun_takes_a_rerun_that_also_evaluates_the_test_split(tmp_path):
    """A rerun may evaluate more than the run (--eval_test added): its test figure is kept."""
    flags = {"seed": 0, "learning_rate": 0.1}
    _summary(tmp_path / "run", {"eval_accuracy": 0.81}, flags)
    _summary(tmp_path / "rerun", {"eval_accuracy": 0.81, "eval_test_accuracy": 0.83},
             flags | {"eval_test": True})
    summary = archive.attach_rerun(tmp_path / "run", tmp_path / "rerun")
    assert summary["final"] == {"eval_accuracy": 0.81}
    assert summary["rerun"]["final"]["eval_test_accuracy"] == 0.83
    assert summary["rerun"]["max_abs_difference_of_shared_metrics"] == 0


@pytest.mark.parametrize("rerun_flags, rounds, expected", [
    ({"seed": 1, "learning_rate": 0.3}, 5, "flags differ"),
    ({"seed": 0, "learning_rate": 0.3}, 4, "ran 4 rounds"),
    ({"seed": 0, "learning_rate": 0.3, "rounds": 5}, 3, "no finished train.py run"),  # stopped
    (None, 5, "no finished train.py run"),
    ("damaged", 5, "rerun/summary.json: not a train.py summary"),
])
def test_attach_rerun_refuses_a_rerun_of_another_run(tmp_path, rerun_flags, rounds, expected):
    """A rerun with other flags or rounds, a stopped or missing one, or a damaged summary.json
    is refused in one line naming the folder or file; the run's summary is left as it was."""
    flags = {"seed": 0, "learning_rate": 0.3}
    _summary(tmp_path / "run", {"train_loss": 0.2}, flags)
    before = (tmp_path / "run" / "summary.json").read_text()
    if rerun_flags == "damaged":
        (tmp_path / "rerun").mkdir()
        (tmp_path / "rerun" / "summary.json").write_text('{"rounds_completed": 5,')
        rerun_flags = None
    elif rerun_flags is not None:
        _summary(tmp_path / "rerun", {"train_loss": 0.2}, rerun_flags, rounds=rounds)
    with pytest.raises(ValueError, match=expected) as raised:
        archive.attach_rerun(tmp_path / "run", tmp_path / "rerun")
    assert "\n" not in str(raised.value)
    if rerun_flags and rerun_flags["seed"] != 0:
        assert "(seed)" in str(raised.value)
    assert (tmp_path / "run" / "summary.json").read_text() == before
