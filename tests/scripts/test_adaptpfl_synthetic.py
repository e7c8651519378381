"""scripts/adaptpfl_synthetic.py: a tiny run in a subprocess writes the table; bad flags are one
line (checked in this process by `adaptpfl_synthetic.parse`, on a FlagValues of the test's own)."""

import csv
import pathlib

import pytest
from absl import flags

from scripts import adaptpfl_synthetic
from tests import forked_python

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "adaptpfl_synthetic.py"


def _run(*args, timeout=300):
    """`python scripts/adaptpfl_synthetic.py ARGS`, a child forked from a Python that has imported TFF."""
    return forked_python.run_script(SCRIPT, *args, timeout=timeout)


def test_tiny_run_prints_and_writes_the_table(tmp_path):
    proc = _run("--num_clients=5", "--num_samples=12", "--dim=6", "--rank=2", "--rounds=3",
                "--alphas=0.3", "--seeds=0", "--head_steps=2", "--shortcut_steps=2",
                f"--output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "[m=12 seed=0] adaptpfl α=0.3: round 3/3, loss" in proc.stdout  # progress
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["alpha"]) for r in rows] == [
        ("fedrep", ""), ("fedrep_gd", "0.0"), ("adaptpfl", "0.3"), ("local", "")]
    assert all(float(r["personalized_error"]) > 0 for r in rows)
    assert rows[-1]["subspace_distance"] == ""  # local least squares has no B
    table = (tmp_path / "results.md").read_text()
    assert "| m | method | α | personalized error | dist(B, B*) |" in table
    assert "| 12 | AdaptPFL | 0.3 |" in table and "| 12 | FedRep (gradient heads) | 0 |" in table
    assert table.strip() in proc.stdout


def _flag_values() -> flags.FlagValues:
    flag_values = flags.FlagValues()
    adaptpfl_synthetic.define_flags(flag_values)
    return flag_values


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--alphas=0.3,1.5"], "--alphas"),
        (["--rank=20"], "--rank"),
        (["--shortcut_ridge=-1"], "--shortcut_ridge"),
        (["--learning_rate=0"], "--learning_rate"),
        (["--init=nope"], "--init"),
        (["--adaptpfl_variant=b", "--alphas=0.3,1"], "--alphas"),
        (["--shortcut_damping=0"], "--shortcut_damping"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        adaptpfl_synthetic.parse(["adaptpfl_synthetic.py", *args, f"--output_dir={tmp_path}"],
                                 _flag_values())
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    assert flag in err[0] and "Traceback" not in stderr


def test_good_flags_give_the_config(tmp_path):
    config = adaptpfl_synthetic.parse(["adaptpfl_synthetic.py", "--alphas=0.3,0.5", "--rank=3",
                                       f"--output_dir={tmp_path / 'out'}"], _flag_values())
    assert config["alphas"] == [0.3, 0.5] and config["rank"] == 3
    assert (tmp_path / "out").is_dir()


def test_the_script_owns_its_flags_for_helpshort():
    """Defined by the script's module, the flags are its key flags, which absl's --helpshort
    lists for the script run."""
    flag_values = _flag_values()
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(adaptpfl_synthetic.__name__)}
    assert key_flags == {
        "num_clients", "num_samples", "dim", "rank", "data_alpha", "shortcut_norm",
        "orthogonal_to_heads", "noise_std", "alphas", "learning_rate", "head_steps",
        "shortcut_steps", "representation_steps", "shortcut_ridge", "adaptpfl_variant",
        "project_shortcut", "shortcut_damping", "head_damping", "adaptpfl_order", "init",
        "methods", "rounds", "seeds", "output_dir"}
