"""scripts/benchmark_text.py: flags -> `tasks.benchmark_text.measure` -> the printed stages."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "benchmark_text.py"


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


def test_prints_every_stage_of_a_tiny_sst2_folder(tmp_path):
    rows = "\n".join(f"sentence number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}"
                     for i in range(40))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows + "\n")
    proc = _run(f"--data_dir={tmp_path}", "--num_clients=4", "--sequence_length=8")
    assert proc.returncode == 0, proc.stderr
    assert "SST-2 train: 40 examples -> 4 clients (dirichlet), sequence_length=8" in proc.stdout
    for stage in ("load_tsv", "build_vocab", "tokenize", "partition", "total"):
        assert f"{stage}:" in proc.stdout


def test_a_missing_folder_and_a_bad_flag_are_one_line(tmp_path):
    missing = _run(f"--data_dir={tmp_path / 'nope'}")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (f"benchmark_text.py: error: flag --data_dir={tmp_path / 'nope'}: "
                                      "no train.tsv there (SST-2 in GLUE's layout, e.g. "
                                      "../shared/data/sst2)")
    bad = _run("--num_clients=0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "benchmark_text.py: error: flag --num_clients=0: must be >= 1"
