"""scripts/benchmark_text.py: flags -> `tasks.benchmark_text.measure` -> the printed stages (a
tiny run in a subprocess); bad flags are checked in this process (`benchmark_text.parse`, on a
FlagValues of the test's own)."""

import pathlib

import pytest
from absl import flags

from scripts import benchmark_text
from tests import forked_python

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "benchmark_text.py"


def _run(*args):
    return forked_python.run_script(SCRIPT, *args, cwd=REPO, timeout=300)


@pytest.mark.large
def test_prints_every_stage_of_a_tiny_sst2_folder(tmp_path):
    rows = "\n".join(f"sentence number {i} is {'good' if i % 2 else 'bad'}\t{i % 2}"
                     for i in range(40))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows + "\n")
    proc = _run(f"--data_dir={tmp_path}", "--num_clients=4", "--sequence_length=8")
    assert proc.returncode == 0, proc.stderr
    assert "SST-2 train: 40 examples -> 4 clients (dirichlet), sequence_length=8" in proc.stdout
    for stage in ("load_tsv", "build_vocab", "tokenize", "partition", "total"):
        assert f"{stage}:" in proc.stdout


def _refused(args: list[str], capsys) -> str:
    """All of stderr of `benchmark_text.py <args>`'s flag check, which must exit with status 2."""
    flag_values = flags.FlagValues()
    benchmark_text.define_flags(flag_values)
    with pytest.raises(SystemExit) as exited:
        benchmark_text.parse(["benchmark_text.py", *args], flag_values)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_missing_folder_and_a_bad_flag_are_one_line(tmp_path, capsys):
    missing = _refused([f"--data_dir={tmp_path / 'nope'}"], capsys)
    assert missing.strip() == (f"benchmark_text.py: error: flag --data_dir={tmp_path / 'nope'}: "
                               "no train.tsv there (SST-2 in GLUE's layout, e.g. "
                               "../shared/data/sst2)")
    bad = _refused(["--num_clients=0"], capsys)
    assert bad.strip() == "benchmark_text.py: error: flag --num_clients=0: must be >= 1"


def test_the_script_owns_its_flags_for_helpshort():
    """Defined by the script's module, the flags are its key flags, which absl's --helpshort
    lists for the script run."""
    flag_values = flags.FlagValues()
    benchmark_text.define_flags(flag_values)
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(benchmark_text.__name__)}
    assert key_flags == {"data_dir", "vocab", "num_clients", "sequence_length", "scheme",
                         "alpha"}
