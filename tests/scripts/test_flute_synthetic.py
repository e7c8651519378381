"""scripts/flute_synthetic.py: a tiny run in a subprocess writes the table; bad flags are one line
(checked in this process by `flute_synthetic.parse`, on a FlagValues of the test's own)."""

import csv
import pathlib

import pytest
from absl import flags

from scripts import flute_synthetic
from tests import forked_python

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "flute_synthetic.py"


def _run(*args, timeout=300):
    """`python scripts/flute_synthetic.py ARGS`, a child forked from a Python that has imported TFF."""
    return forked_python.run_script(SCRIPT, *args, timeout=timeout)


def test_tiny_run_prints_and_writes_the_table(tmp_path):
    proc = _run("--ks=2", "--num_clients=6", "--num_samples=8", "--rounds=3", "--report_rounds=2",
                "--seeds=0", "--fedrep_learning_rates=0.03", f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[M=6 k=2 seed=0] flute η=0.03: round 3/3, error" in proc.stdout  # progress
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["flute", "fedrep_ri", "fedrep_mom"]
    for r in rows:
        assert float(r["error_round_3"]) > 0 and float(r["error_round_2"]) > 0
        assert r["num_clients"] == "6" and r["k"] == "2"
    table = (tmp_path / "results.md").read_text()
    assert "| M | k | method | η | round 2 | final (round 3) |" in table
    assert "| 6 | 2 | FLUTE | 0.03 |" in table and "| 6 | 2 | FedRep(RI) | 0.03 |" in table
    assert "rank-k optimum" in table and "Paper (flute.md" in table
    assert table.strip() in proc.stdout
    assert (tmp_path / "tff_worker.log").exists()


def _flag_values() -> flags.FlagValues:
    flag_values = flags.FlagValues()
    flute_synthetic.define_flags(flag_values)
    return flag_values


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--ks=2,11"], "--ks"),
        (["--gamma1=-0.5"], "--gamma1"),
        (["--rounds=5", "--report_rounds=5"], "--report_rounds"),
        (["--methods=flute,nope"], "--methods"),
        (["--output_dir=/proc/tffl_not_writable"], "--output_dir"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path, capsys):
    if not any(a.startswith("--output_dir") for a in args):
        args = [*args, f"--output_dir={tmp_path}"]
    with pytest.raises(SystemExit) as exited:
        flute_synthetic.parse(["flute_synthetic.py", *args], _flag_values())
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    assert flag in err[0] and "Traceback" not in stderr


def test_good_flags_give_the_config(tmp_path):
    config = flute_synthetic.parse(["flute_synthetic.py", "--ks=2,1", "--methods=flute",
                                    f"--output_dir={tmp_path / 'out'}"], _flag_values())
    assert config["ks"] == [2, 1] and config["methods"] == ["flute"]
    assert (tmp_path / "out").is_dir()


def test_the_script_owns_its_flags_for_helpshort():
    """Defined by the script's module, the flags are its key flags, which absl's --helpshort
    lists for the script run."""
    flag_values = _flag_values()
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(flute_synthetic.__name__)}
    assert key_flags == {"ks", "num_clients", "num_samples", "dim", "noise_variance",
                         "learning_rate", "gamma1", "gamma2", "fedrep_learning_rates", "methods",
                         "rounds", "report_rounds", "seeds", "output_dir"}
