"""scripts/train.py's command line before any heavy import: `runner.train_flags` parses and
checks the flags (one line on stderr and exit status 2 for a bad one) without TensorFlow, from the
defaults and choices of `runner.train_options`, whose copies of the heavy modules' choices
must match them.

Everything runs in this process but the import-isolation test, which needs a fresh interpreter.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from runner import train_flags
from runner import train_options
from runner.run_config import RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _flag_values() -> flags.FlagValues:
    """train.py's flags in a FlagValues of their own (absl's global ones stay untouched)."""
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    return flag_values


def _refused(args: list[str], capsys) -> str:
    """The one stderr line of `train.py <args>`'s flag parsing, which must exit with status 2."""
    with pytest.raises(SystemExit) as exited:
        train_flags.parse(["train.py", *args], _flag_values())
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_an_unknown_flag_is_one_line_and_status_2(capsys):
    assert _refused(["--nope"], capsys) == "train.py: error: Unknown command line flag 'nope'"


def test_a_negative_seed_is_refused_before_the_run_directory_is_made(tmp_path, capsys):
    run_dir = tmp_path / "run"
    line = _refused(["--seed=-5", f"--output_dir={run_dir}"], capsys)
    assert line == ("train.py: error: flag --seed=-5: must be between 0 and 4294967295 (a NumPy "
                    "seed)")
    assert not run_dir.exists()


@pytest.mark.parametrize("args, message", [
    (["--rounds=-3"], "flag --rounds=-3: must be >= 1"),
    (["--seed=4294967296"], "flag --seed=4294967296: must be between 0 and 4294967295"),
    (["--algorithm=rolora", "--rank=65"],
     "flag --rank=65: must be between 1 and the input width 64"),
    (["--algorithm=fedrep", "--representation=lora", "--rank=70"],
     "flag --rank=70: must be between 1 and the input width 64"),
    (["--algorithm=flora", "--client_ranks=2,65"],
     "flag --client_ranks=2,65: rank 65: must be between 1 and the input width 64"),
    (["--task=mnist", "--algorithm=rolora", "--rank=800"],
     "flag --rank=800: must be between 1 and the input width 784"),
    (["--task=reviews", "--algorithm=fedrep"], "flag --data_dir: is needed: task 'reviews'"),
    (["--task=sst2_instruct", "--algorithm=rolora"],
     "flag --backbone=tiny: task 'sst2_instruct' trains a decoder language model; choose one of "
     "gpt2_tiny, gemma3_270m"),
    (["--task=sst2", "--backbone=gpt2_tiny", "--algorithm=rolora"],
     "flag --backbone=gpt2_tiny: task 'sst2' trains a classifier on an encoder (tiny, minilm); "
     "for a decoder pass --task=sst2_instruct"),
    (["--task=sst2_instruct", "--backbone=gpt2_tiny", "--algorithm=rolora,fedrep"],
     "flag --algorithm=rolora,fedrep: task 'sst2_instruct' runs the LoRA algorithms"),
    (["--task=sst2_instruct", "--backbone=gpt2_tiny", "--algorithm=rolora", "--eval_per_client"],
     "flag --eval_per_client: task 'sst2_instruct' evaluates the global model"),
    (["--task=reviews_instruct", "--backbone=gpt2_tiny", "--algorithm=rolora"],
     "flag --data_dir: is needed: task 'reviews_instruct'"),
    (["--task=reviews", "--algorithm=fedrep", "--data_dir=x", "--num_clients=7",
      "--clients_per_round=7"], "flag --num_clients=7: the review task splits each of its 5"),
    (["--task=sst2", "--algorithm=fedavg", "--eval_test"],
     "flag --eval_test=True: TFDS's SST-2 test split is unlabelled"),
    (["--task=text", "--algorithm=rolora"],
     "flag --task=text: give your rows as --train_file=<file> (CSV, TSV, JSON Lines) or a TFDS "
     "dataset as --tfds_name=<name>, one of the two"),
    (["--task=text", "--algorithm=rolora", "--train_file=no/such.csv"],
     "flag --train_file=no/such.csv: no such file"),
    (["--task=text", "--algorithm=rolora", "--train_file=rows.xlsx"],
     "flag --train_file=rows.xlsx: a .csv, .tsv, .jsonl, .ndjson file, by its suffix"),
    (["--algorithm=rolora", "--train_file=rows.csv"],
     "flag --train_file: names your own data, for --task=text or --task=instruct, not "
     "--task=digits"),
    (["--task=text", "--algorithm=rolora", "--tfds_name=imdb_reviews", "--dev_file=d.csv"],
     "flag --dev_file: does not apply to --task=text with --tfds_name=imdb_reviews"),
    (["--task=text", "--algorithm=rolora", "--tfds_name=imdb_reviews", "--tfds_splits=train"],
     "flag --tfds_splits=train: give the training and dev splits"),
    (["--task=text", "--algorithm=rolora", "--tfds_name=imdb_reviews", "--eval_test"],
     "flag --eval_test: give the held-out test split as --test_file=<file>"),
    (["--task=instruct", "--backbone=gpt2_tiny", "--algorithm=rolora"],
     "flag --task=instruct: give your instructions as --train_file=<Alpaca JSON or JSON Lines "
     "file>"),
    (["--task=text", "--backbone=gpt2_tiny", "--algorithm=rolora", "--tfds_name=x"],
     "for a decoder pass --task=instruct"),
    (["--prefix_cache_dtype=float16"], "flag --prefix_cache_dtype=float16: is for the prefix "
     "cache of the text tasks"),
    (["--task=sst2", "--noprefix_cache", "--prefix_cache_dtype=float16"],
     "which --noprefix_cache turns off"),
    (["--task=sst2", "--base_dtype=bfloat16"], "flag --base_dtype=bfloat16: a lower-precision "
     "base is for the instruction tasks (sst2_instruct, reviews_instruct, instruct) on "
     "--backbone=gemma3_270m"),
    (["--task=sst2_instruct", "--backbone=gpt2_tiny", "--base_dtype=bfloat16"],
     "on --backbone=gemma3_270m"),
    (["--task=sst2_instruct", "--backbone=gemma3_270m", "--algorithm=flora",
      "--base_dtype=bfloat16"], "flag --base_dtype=bfloat16: flora merges the adapters into the "
     "frozen kernels every round"),
    (["--base_dtype=int8"], "flag --base_dtype=int8: a lower-precision base is for the "
     "instruction tasks"),
    (["--base_dtype=int4"], "flag --base_dtype=int4: "),   # absl's enum error
    (["--max_concurrent_calls=0"], "flag --max_concurrent_calls=0: must be >= 1, and is for "
     "local TFF workers"),
    (["--max_concurrent_calls=1", "--worker_addresses=localhost:8000"],
     "flag --max_concurrent_calls=1: must be >= 1, and is for local TFF workers"),
    (["--algorithm=nope"], "flag --algorithm=nope: unknown nope; choose from fedrep"),
    (["--rounds=x"], "flag --rounds=x: "),   # absl's own error for a malformed value
    (["--task=cifar"], "flag --task=cifar: "),
    (["positional"], "unexpected arguments: positional (flags are --name=value)"),
])
def test_a_value_that_cannot_work_is_one_line_naming_the_flag(args, message, tmp_path, capsys):
    line = _refused([*args, f"--output_dir={tmp_path}"], capsys)
    assert line.startswith("train.py: error: ") and message in line, line


def test_the_users_rows_and_how_they_become_clients_are_checked_together(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a", "response": "b", "user": "u"}\n')
    for args, message in (
            (["--task=instruct", "--partition=shards"],
             "flag --partition=shards: instruction rows have no labels to split by; use "
             "--partition=iid or --client_column=<column>"),
            (["--task=instruct", "--client_column=user", "--num_clients=3"],
             "flag --num_clients=3: the clients come from --client_column=user; drop one of the "
             "two"),
            (["--task=instruct", "--text_column=x"], "flag --text_column: does not apply to "
             "--task=instruct")):
        line = _refused([*args, "--backbone=gpt2_tiny", "--algorithm=rolora",
                         f"--train_file={rows}", f"--output_dir={tmp_path / 'run'}"], capsys)
        assert message in line, line


@pytest.mark.parametrize("args", [
    ["--algorithm=rolora", "--rank=64"],
    ["--task=mnist", "--algorithm=rolora", "--rank=65"],                # MNIST is 784 wide
    ["--algorithm=fedrep", "--rank=65"],                                # an MLP: no LoRA rank
    ["--algorithm=flora", "--client_ranks=2,64"],
    ["--task=reviews", "--algorithm=fedrep", "--data_dir=x", "--num_clients=10"],
    ["--task=sst2_instruct", "--backbone=gpt2_tiny", "--algorithm=rolora,ffa_lora"],
])
def test_values_that_work_pass_and_make_the_run_directory(args, tmp_path):
    run_dir = tmp_path / "run"
    config = train_flags.parse(["train.py", *args, f"--output_dir={run_dir}"], _flag_values())
    assert config.output.output_dir == str(run_dir)
    assert run_dir.is_dir()


def test_importing_train_py_and_its_flags_imports_no_tensorflow():
    """In a fresh interpreter: scripts/train.py's module level (and so --help or a bad flag) needs
    absl and this project's light modules only."""
    code = ("import sys; from scripts import train; from runner import train_flags; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_federated', 'keras', 'tffl')); "
            "assert not heavy, heavy; print('light')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0 and proc.stdout.strip() == "light", proc.stderr


def test_the_flags_are_defaults_one_to_one():
    """One flag per DEFAULTS entry (but "rank_present"), with that default: the one place of the
    defaults."""
    flag_values = _flag_values()
    flag_values(["train.py"])
    assert set(train_flags.NAMES) == set(train_options.DEFAULTS) - {"rank_present"}
    assert train_flags.options(flag_values) == train_options.DEFAULTS
    assert train_flags.present(flag_values) == set()


def test_the_script_owns_its_flags_for_helpshort():
    """Defined for "__main__", the flags are the key flags of the script run (sys.argv[0]),
    which absl's --helpshort lists."""
    flag_values = flags.FlagValues()
    train_flags.define(flag_values, module_name="__main__")
    key_flags = {f.name for f in flag_values.get_key_flags_for_module(sys.argv[0])}
    assert key_flags == set(train_flags.NAMES) | {"config"}


def test_the_copied_choices_match_the_modules_that_import_tensorflow():
    """train_options repeats choices of modules that import TensorFlow; they must agree."""
    from runner import algorithms
    from models import classifier_options
    from models import decoders
    from tasks import data_files
    from tasks import instruct_run_task
    from tasks import registry
    from tasks import task_config
    from tasks import text_run_task
    from tasks.task_config import TaskConfig
    from tffl.runtime import graph_optimization

    for name in ("KERAS_ALGORITHMS", "LORA_ALGORITHMS", "REPRESENTATIONS", "PARTICIPATIONS",
                 "STRAGGLER_MODELS", "OPTIMIZERS"):
        assert getattr(train_options, name) == getattr(algorithms, name), name
    for name in ("TASKS", "BACKBONES", "PARTITIONS"):
        assert getattr(train_options, name) == getattr(registry, name), name
    assert train_options.TEXT_TASKS == text_run_task.TEXT_TASKS
    assert train_options.INSTRUCT_TASKS == instruct_run_task.INSTRUCT_TASKS
    assert train_options.FILE_TASKS == task_config.FILE_TASKS
    assert set(train_options.INSTRUCTION_SUFFIXES) == set(data_files.FORMATS)
    assert set(train_options.TEXT_SUFFIXES) == set(data_files.FORMATS) - {".json"}
    assert set(train_options.FILE_FLAGS) <= {f.name for f in dataclasses.fields(TaskConfig)}
    assert train_options.DECODERS == decoders.DECODERS
    assert train_options.INPUT_WIDTHS.keys() == (set(registry.TASKS) - set(text_run_task.TEXT_TASKS)
                                                 - set(instruct_run_task.INSTRUCT_TASKS))
    specs = {f.name: f for f in train_flags.SPECS}
    assert specs["pooling"].choices == classifier_options.POOLINGS
    assert specs["head"].choices == classifier_options.HEADS
    assert tuple(specs["graph_optimization"].choices) == graph_optimization.GRAPH_OPTIMIZATIONS
    assert train_options.DEFAULTS["graph_optimization"] is None   # the model's choice
    assert graph_optimization.DEFAULT_GRAPH_OPTIMIZATION in graph_optimization.GRAPH_OPTIMIZATIONS
    for changes, rank in (({}, 16), ({"client_ranks": ["2", "8"]}, 8),
                          ({"client_ranks": ["2", "8"], "rank": 4, "rank_present": True}, 4)):
        options = dict(train_options.DEFAULTS, **changes)
        model = RunConfig.from_flag_values(options).model
        assert train_options.client_ranks(options) == list(model.client_ranks or [])
        assert train_options.adapter_rank(options) == model.adapter_rank == rank


def test_the_lora_models_of_the_rank_check_are_the_algorithms_ones():
    """`train_options` bounds the rank of the algorithms whose model is a LoRA net
    (`runner.algorithms.model_for`); the same algorithms, for each representation."""
    from runner import algorithms

    for representation in train_options.REPRESENTATIONS:
        for algorithm in train_options.KERAS_ALGORITHMS:
            if algorithm == "adaptpfl" and representation != "mlp":
                continue  # refused by the checks
            options = dict(train_options.DEFAULTS, algorithm=[algorithm], rank=65,
                           representation=representation, rank_present=True)
            lora = algorithms.model_for(algorithm, representation).startswith(("lora_net",
                                                                                 "lora_head"))
            try:
                train_options.check(options)
                message = ""
            except train_options.UsageError as e:
                message = str(e)
            refused = message == "flag --rank=65: must be between 1 and the input width 64"
            assert refused == lora, (algorithm, representation, message)
