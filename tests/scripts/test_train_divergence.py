"""scripts/train.py: a diverging run stops with one line naming the learning rate, exit status 1,
and its last good checkpoint kept (`tffl.simulation.metrics_log.LossDivergedError`), in this process."""

from tests.scripts import train_runs
from tffl.simulation import checkpoint, driver


def test_a_diverging_learning_rate_stops_the_run_in_one_line(tmp_path, capsys):
    # RoLoRA's train losses at --learning_rate=1e6 were about 1e3, 1.6e14 and 2e26.
    run = train_runs.run_in_process(capsys, "--algorithm=rolora", "--learning_rate=1e6",
                                    "--rounds=3", f"--output_dir={tmp_path}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].startswith("train.py: error: round 2: training loss "), lines
    assert "the run diverged with --learning_rate=1000000.0" in lines[0], lines
    assert "last good checkpoint (round 1) is kept" in lines[0], lines
    assert "round 1/3" in run.stdout and "round 2/3" not in run.stdout
    assert checkpoint.latest(tmp_path / driver.CHECKPOINT_DIR)[0] == 1
    assert [r["round"] for r in train_runs.rows(tmp_path)] == [1]
