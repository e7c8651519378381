"""runner.run_config and runner.run: the typed run configuration, its config.json, and
the re-run command generated from it (which must reproduce the run's first round exactly)."""

import csv
import json
import shlex

import pytest
from absl import flags

from runner import run
from runner import train_flags
from runner import train_options
from runner.cli import UsageError
from runner.run_config import RunConfig

# Configurations whose every kind of field differs from the default: tuples of strings and of
# integers, None against a default, booleans set false, an SRPFL stage given by name.
CONFIGS = [
    RunConfig(),
    RunConfig().with_changes(algorithm=["flora"], client_ranks=[2, 8], rounds=3, seed=7),
    RunConfig().with_changes(algorithm=["flora"], client_ranks="2,8", rank=8),
    RunConfig().with_changes(task="sst2", backbone="minilm", pooling="mean", lora_layers=[3, 4],
                             lora_targets=["query"], prefix_cache=False, sequence_length=64,
                             data_dir="../shared/data", eval_test=True),
    RunConfig().with_changes(algorithm=["fedrep"], participation="srpfl",
                             stage_rounds="lemma_b1", bucket_by_length=False, finetune_epochs=2,
                             averaging_error=False, learning_rate=0.03),
]


def _parsed(command: str, tmp_path) -> RunConfig:
    """The RunConfig train.py's flag parsing makes of `command` (in this process)."""
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    argv = shlex.split(command)[1:] + [f"--output_dir={tmp_path / 'out'}"]
    return train_flags.parse(argv, flag_values).with_changes(output_dir=None)


@pytest.mark.parametrize("config", CONFIGS)
def test_json_and_flag_values_round_trip(config):
    assert RunConfig.from_json(config.to_json()) == config
    assert RunConfig.from_flag_values(config.flag_values()) == config
    assert json.loads(config.to_json())["model"]["rank"] == config.model.rank


@pytest.mark.parametrize("config", CONFIGS)
def test_the_command_parses_back_to_the_same_configuration(config, tmp_path):
    assert _parsed(config.command(), tmp_path) == config


def test_each_field_is_one_flag_and_the_defaults_are_the_flags():
    names = [name for name, _ in RunConfig().items()]
    assert len(names) == len(set(names))
    assert set(names) == set(train_flags.NAMES)
    assert RunConfig().flag_values() == train_options.DEFAULTS


def test_the_adapter_rank_is_the_rank_else_the_largest_client_rank_else_16():
    model = RunConfig().model
    assert model.adapter_rank == 16
    assert RunConfig().with_changes(client_ranks=[2, 8]).model.adapter_rank == 8
    assert RunConfig().with_changes(client_ranks=[2, 8], rank=12).model.adapter_rank == 12


def test_unknown_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown field 'nope'"):
        RunConfig().with_changes(nope=1)
    with pytest.raises(ValueError, match="unknown field model.rounds"):
        RunConfig.from_dict({"model": {"rounds": 3}})
    with pytest.raises(ValueError, match="unknown section 'optim'"):
        RunConfig.from_dict({"optim": {}})
    # A flat file of flags, not of sections: the unknown name is named, not a list's item.
    with pytest.raises(ValueError, match="unknown section 'no_such_field'; expected task"):
        RunConfig.from_dict({"algorithm": ["rolora"], "no_such_field": 1})
    with pytest.raises(ValueError, match="unknown section 'rounds'; field 'rounds' belongs in "
                                         "section 'algorithm'"):
        RunConfig.from_dict({"rounds": 3})
    with pytest.raises(ValueError, match="section 'algorithm' must map its fields to values, "
                                         "got a list"):
        RunConfig.from_dict({"algorithm": ["rolora"]})


def test_resolve_checks_like_the_command_line_and_makes_the_folder(tmp_path):
    with pytest.raises(UsageError, match=r"flag --clients_per_round=8: must be <= "
                                         r"--num_clients=5"):
        run.resolve(RunConfig().with_changes(clients_per_round=8, output_dir=str(tmp_path)))
    resolved = run.resolve(RunConfig().with_changes(output_dir=str(tmp_path / "r")))
    assert (tmp_path / "r").is_dir() and resolved.output.output_dir == str(tmp_path / "r")


def test_resolve_records_the_users_files_as_absolute_paths(tmp_path, monkeypatch):
    (tmp_path / "rows.csv").write_text("text,label\na,1\nb,0\n")
    monkeypatch.chdir(tmp_path)
    resolved = run.resolve(RunConfig().with_changes(
        task="text", train_file="rows.csv", dev_file="rows.csv", partition="iid",
        algorithm=["rolora"], output_dir=str(tmp_path / "r")))
    assert resolved.task.train_file == resolved.task.dev_file == str(tmp_path / "rows.csv")
    assert resolved.task.test_file is None


def test_config_file_flag_starts_from_the_file_and_flags_change_it(tmp_path):
    saved = CONFIGS[1].with_changes(output_dir=str(tmp_path / "a"))
    path = tmp_path / "config.json"
    path.write_text(saved.to_json())
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    parsed = train_flags.parse(["train.py", f"--config={path}", "--rounds=5",
                                f"--output_dir={tmp_path / 'b'}"], flag_values)
    assert parsed == saved.with_changes(rounds=5, output_dir=str(tmp_path / "b"))


def test_read_config_of_a_folder_without_one_names_the_file(tmp_path):
    with pytest.raises(UsageError, match="config.json: not found"):
        run.read_config(tmp_path)


def _metrics(folder):
    with open(folder / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.large
def test_the_rerun_command_of_config_json_reproduces_the_first_round(tmp_path, capsys):
    """A comparison of two algorithms, in this process; each run folder holds config.json; the
    re-run command printed in comparison.md, run again, gives the same first round (every
    metric but the machine's: timings and peak memory), bit for bit."""
    from scripts import train
    from tffl.simulation import metrics_log

    first = tmp_path / "first"
    assert train.run_command_line(["train.py", "--algorithm=fedavg_lora,rolora", "--rounds=1",
                                   "--learning_rate=0.3", "--seed=3",
                                   f"--output_dir={first}"]) == 0
    saved = run.read_config(first)
    assert saved.algorithm.algorithm == ("fedavg_lora", "rolora")
    assert run.read_config(first / "rolora").algorithm.algorithm == ("rolora",)
    command = run.rerun_command(saved)
    assert f"`{command}`" in (first / "comparison.md").read_text()
    again = tmp_path / "again"
    argv = shlex.split(command)[1:]
    assert argv[0] == "scripts/train.py"
    assert train.run_command_line(["train.py", *argv[1:], f"--output_dir={again}"]) == 0
    timing = set(metrics_log.MACHINE_COLUMNS) | {"wall_seconds", "client_seconds"}
    for algorithm in ("fedavg_lora", "rolora"):
        before, after = _metrics(first / algorithm), _metrics(again / algorithm)
        assert before and after
        for row_before, row_after in zip(before, after):
            kept = {k for k in row_before if k not in timing and not k.endswith("_seconds")}
            assert {k: row_before[k] for k in kept} == {k: row_after[k] for k in kept}
    capsys.readouterr()


def test_a_config_file_runs_in_this_process_as_in_a_child(tmp_path, capsys):
    """`python -m runner.run CONFIG.json` (the experiments' crash-isolating child) is
    `run.main`; a malformed file is one line and status 2."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"nope": 1}}')
    assert run.main(["runner.run", str(bad)]) == 2
    assert "unknown field model.nope" in capsys.readouterr().err
    config = RunConfig().with_changes(algorithm=["fedavg"], rounds=1, eval_every=1,
                                      output_dir=str(tmp_path / "run"))
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    assert run.main(["runner.run", str(path)]) == 0
    assert "done: fedavg 1 communication round" in capsys.readouterr().out
    assert RunConfig.from_json((tmp_path / "run" / "config.json").read_text()) == config


@pytest.mark.parametrize("section, field, value", [
    ("algorithm", "rounds", "x"), ("algorithm", "learning_rate", "fast"),
    ("model", "client_ranks", ["a"]), ("output", "resume", "yes"), ("task", "task", 3),
])
def test_a_config_file_with_a_wrong_type_is_refused_naming_the_field(section, field, value):
    with pytest.raises(ValueError, match=f"run configuration: {field}="):
        RunConfig.from_dict({section: {field: value}})
