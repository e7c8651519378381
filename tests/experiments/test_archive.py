"""experiments.archive: which copy of a finished run wins when the output folder and the archive
both hold one."""

import json
import os

from experiments import archive


def _finished(folder, marker, mtime):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"rounds_completed": 5, "marker": marker}))
    (folder / "metrics.csv").write_text(f"round,marker\n5,{marker}\n")
    os.utime(folder / "summary.json", (mtime, mtime))


def test_a_stale_output_copy_never_overwrites_a_newer_archived_run(tmp_path):
    """An output folder left from an earlier sitting (--collect's, say) holds an older
    summary.json than the archive, whose copy was re-evaluated since: the archive keeps its
    own, and the summary returned is the output folder's own finished one."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _finished(out / "r", "stale", 1_000)
    _finished(kept / "r", "re-evaluated", 2_000)
    assert archive.train_once(out / "r", 5, None, out, kept)["marker"] == "stale"
    assert json.loads((kept / "r" / "summary.json").read_text())["marker"] == "re-evaluated"
    assert "re-evaluated" in (kept / "r" / "metrics.csv").read_text()


def test_a_newer_output_copy_replaces_the_archived_run(tmp_path):
    """The run re-evaluated in its output folder (train.py --evaluate_only) after it was
    archived: the newer summary.json and its metrics go to the archive."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _finished(kept / "r", "archived", 1_000)
    _finished(out / "r", "re-evaluated", 2_000)
    archive.train_once(out / "r", 5, None, out, kept)
    assert json.loads((kept / "r" / "summary.json").read_text())["marker"] == "re-evaluated"
    assert "re-evaluated" in (kept / "r" / "metrics.csv").read_text()
