"""scripts/attach_rerun.py: records a rerun, refuses one of another run. In this process
(`attach_rerun.attach` on a FlagValues of the test's own) but for one run of the script in a
subprocess."""

import json
import pathlib

from absl import flags

from scripts import attach_rerun
from tests import forked_python

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "attach_rerun.py"


def _run(*args):
    return forked_python.run_script(SCRIPT, *args, timeout=120, cwd=SCRIPT.parents[1])


class _Done:
    """What the tests read of a run: exit status, stdout, stderr."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _attach(capsys, *args) -> _Done:
    """`attach_rerun.py <args>` in this process."""
    flag_values = flags.FlagValues()
    attach_rerun.define_flags(flag_values)
    flag_values(["attach_rerun.py", *args])
    status = attach_rerun.attach(flag_values)
    out, err = capsys.readouterr()
    return _Done(status, out, err)


def _summary(folder, final, seed):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(
        {"rounds_completed": 3, "final": final, "flags": {"seed": seed}}))
    (folder / "metrics.csv").write_text("round\n3\n")


def test_attach_rerun_records_the_rerun_and_names_bad_input(tmp_path, capsys):
    run, rerun, other = tmp_path / "run", tmp_path / "rerun", tmp_path / "other"
    _summary(run, {"eval_personal_accuracy": 0.75}, 0)
    _summary(rerun, {"eval_personal_accuracy": 0.5, "eval_personal_test_accuracy": 0.25}, 0)
    _summary(other, {"eval_personal_accuracy": 0.5}, 1)

    missing = _attach(capsys, f"--run={run}")
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0
    assert "--rerun" in missing.stderr
    refused = _attach(capsys, f"--run={run}", f"--rerun={other}")
    assert refused.returncode == 1 and "seed" in refused.stderr, refused.stderr
    assert "rerun" not in json.loads((run / "summary.json").read_text())

    done = _run(f"--run={run}", f"--rerun={rerun}")  # the script itself, in a subprocess
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rerun metrics the run lacks"] == ["eval_personal_test_accuracy"]
    assert report["max_abs_difference_of_shared_metrics"] == 0.25
    assert report["machine"] == "not recorded for both"  # summaries from before the record
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"] == {"eval_personal_accuracy": 0.75}
    assert summary["rerun"]["final"]["eval_personal_test_accuracy"] == 0.25


def test_attach_rerun_reports_whether_the_machines_differ(tmp_path, capsys):
    cpu = {"cpu": "Xeon", "cpu_features": ["avx2", "avx512f"], "cpus": 2}
    for name, record in (("run", cpu), ("same", cpu),
                         ("other", dict(cpu, cpu_features=["avx2"]))):
        _summary(tmp_path / name, {"eval_personal_accuracy": 0.5}, 0)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        (tmp_path / name / "summary.json").write_text(json.dumps(dict(summary, machine=record)))
    same = _attach(capsys, f"--run={tmp_path / 'run'}", f"--rerun={tmp_path / 'same'}")
    assert same.returncode == 0 and json.loads(same.stdout)["machine"] == "the same"
    other = _attach(capsys, f"--run={tmp_path / 'run'}", f"--rerun={tmp_path / 'other'}")
    assert json.loads(other.stdout)["machine"] == "differs in cpu_features"


def test_the_script_owns_its_flags_for_helpshort():
    """Defined by the script's module, the flags are its key flags, which absl's --helpshort
    lists for the script run."""
    flag_values = flags.FlagValues()
    attach_rerun.define_flags(flag_values)
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(attach_rerun.__name__)}
    assert key_flags == {"run", "rerun"}
