"""runner.tensorflow_import: TensorFlow imported inside absl's `main` leaves Keras unable to
build models; scripts import it in their flags parser, and `runner.run.run` says so in one line.

The process tests start new interpreters (not tests/forked_python.py's children: those fork from a
Python that imported TensorFlow first, where the fault cannot happen), so they are large."""

import pathlib
import re
import subprocess
import sys

import pytest

from runner import tensorflow_import

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Scripts whose main builds no Keras model, so TensorFlow may load late (or not at all) there.
NO_KERAS_SCRIPTS = {"attach_rerun.py", "memory_timeline.py", "start_worker.py"}

PROGRAM = """
import sys
from absl import app
from absl import flags
from runner import tensorflow_import

def main(argv):
    import tensorflow as tf
    sound = tensorflow_import.eager_context_is_sound()
    print(sound, type(tf.keras.Input(shape=(3,))).__name__)
    try:
        tensorflow_import.check_eager_context()
    except RuntimeError as e:
        print("error:", e)

parser = flags.FLAGS if sys.argv[1] == "late" else (
    tensorflow_import.importing_tensorflow(flags.FLAGS))
app.run(main, flags_parser=parser)
"""


def _run_program(when: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROGRAM, when], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={"TF_CPP_MIN_LOG_LEVEL": "3",
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()


@pytest.mark.large
def test_tensorflow_imported_inside_main_breaks_keras_and_is_named():
    # The fault itself (TensorFlow 2.14 under absl's app.run): a graph tensor, not a KerasTensor.
    lines = _run_program("late")
    assert lines[0] == "False SymbolicTensor"
    assert lines[1].startswith("error: TensorFlow was first imported inside absl's app.run main")
    assert "importing_tensorflow" in lines[1]


@pytest.mark.large
def test_tensorflow_imported_by_the_flags_parser_leaves_keras_sound():
    assert _run_program("parser") == ["True KerasTensor"]


def test_importing_tensorflow_runs_the_parser_first_and_returns_its_result():
    seen = []

    def parser(argv):
        seen.append(list(argv))
        return argv[:1]

    assert tensorflow_import.importing_tensorflow(parser)(["x.py", "--a=1"]) == ["x.py"]
    assert seen == [["x.py", "--a=1"]]
    assert "tensorflow" in sys.modules and "tffl.runtime" in sys.modules


def test_a_bad_flag_exits_before_tensorflow_is_imported(monkeypatch):
    imported = []
    monkeypatch.setattr(tensorflow_import, "import_tensorflow", lambda: imported.append(1))

    def parser(argv):
        sys.exit(2)

    with pytest.raises(SystemExit):
        tensorflow_import.importing_tensorflow(parser)(["x.py", "--nope"])
    assert imported == []


def test_this_process_is_sound():
    assert tensorflow_import.eager_context_is_sound()
    tensorflow_import.check_eager_context()


@pytest.mark.parametrize("script", sorted(
    p.name for p in (ROOT / "scripts").glob("*.py")
    if "app.run(" in p.read_text() and p.name not in NO_KERAS_SCRIPTS))
def test_every_model_building_script_imports_tensorflow_before_main(script):
    # reproduce.py once imported it first inside main: every MiniLM run failed in Keras.
    text = (ROOT / "scripts" / script).read_text()
    entry = text[text.index('if __name__ == "__main__":'):]
    parser = re.search(r"flags_parser=(\w+)", entry)
    if "importing_tensorflow(" in entry or "import_tensorflow()" in entry:
        return
    assert parser, f"{script}: app.run without a flags parser that imports TensorFlow"
    body = text[text.index(f"def {parser.group(1)}("):]
    body = body[:body.index("\ndef ", 1)] if "\ndef " in body[1:] else body
    assert re.search(r"import_tensorflow\(\)|_import_heavy\(\)|importing_tensorflow\(", body), (
        f"{script}: its flags parser {parser.group(1)} does not import TensorFlow")


@pytest.mark.large
@pytest.mark.parametrize("given", [None, "0"])
def test_the_driver_takes_the_system_allocator_and_its_workers_do_not(given):
    # Set for the driver unless the user chose; a local worker starts without it then.
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
    if given is not None:
        env[tensorflow_import.SYSTEM_ALLOCATOR] = given
    program = ("import os\nfrom runner import tensorflow_import\n"
               "tensorflow_import.import_tensorflow()\n"
               "from tffl.runtime import workers\n"
               f"name = {tensorflow_import.SYSTEM_ALLOCATOR!r}\n"
               "print(os.environ.get(name), workers.worker_environment().get(name))")
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = "1 None" if given is None else f"{given} {given}"
    assert proc.stdout.strip().splitlines()[-1] == expected


def test_the_marker_is_the_runtimes():
    from tffl.runtime import workers

    assert tensorflow_import.DRIVER_ONLY_ENV == workers.DRIVER_ONLY_ENV
