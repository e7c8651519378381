"""experiments/reviews' `reviews_domains` over several invocations: --methods, --collect and --archive_dir,
with the training runs replaced by a recorder of their RunConfigs that writes the summary a
finished run would."""

import json
import pathlib

from experiments import reviews
from runner import running


def _fake_train(runs):
    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(config.output.output_dir)
        runs.append((run_dir.name, config.output.resume))
        run_dir.mkdir(parents=True, exist_ok=True)
        accuracy = {"rolora": 0.8, "fedrep": 0.9}[run_dir.name]
        key = "eval_personal_accuracy" if run_dir.name == "fedrep" else "eval_accuracy"
        (run_dir / "metrics.csv").write_text("round\n")
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": config.algorithm.rounds, "communication_rounds": 6,
            "upload_bytes_per_client_total": 6 * 1024,
            "final": {key: accuracy, **{f"eval_{d}_accuracy": accuracy
                                        for d in reviews.REVIEW_DOMAIN_NAMES}}}))
    return fake_train


def test_reviews_domains_methods_archive_and_collect(tmp_path, monkeypatch):
    """Only --methods run; their finished files go to the archive; a fresh output folder with
    the archive runs nothing and tabulates the same rows; --collect without the archive runs
    nothing and has no rows."""
    runs = []
    monkeypatch.setattr(reviews, "run_training", _fake_train(runs))
    archive = tmp_path / "archive"

    def table(output_dir, **kw):
        ctx = running.Context("reviews_domains", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora", "fedrep"), **kw)
        monkeypatch.setattr(reviews, "need_data", lambda ctx, name: None)
        return reviews.run_reviews_domains(ctx).table.rows

    rows = table(tmp_path / "first", archive_dir=archive)
    assert runs == [("rolora", False), ("fedrep", False)]
    assert [(r["kind"], r["pooled"], r["books"]) for r in rows] == [
        ("global", 0.8, 0.8), ("personalized", 0.9, 0.9)]
    assert sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*")
                  if p.is_file()) == ["fedrep/metrics.csv", "fedrep/summary.json",
                                      "rolora/metrics.csv", "rolora/summary.json"]
    runs.clear()
    assert table(tmp_path / "fresh", archive_dir=archive) == rows and runs == []
    assert table(tmp_path / "empty", collect=True) == [] and runs == []
