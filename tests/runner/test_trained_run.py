"""runner/trained_run.py: a run's configuration from its folder (config.json, or the
identity an older checkpoint recorded), and the one-line refusals of folders that hold no run's
checkpoint. Rebuilding a trained model end to end: tests/runner/test_export.py (its
export reproduces the run's recorded dev loss) and tests/scripts/test_generate.py."""

import json

import pytest

from runner import trained_run
from runner.run_config import RunConfig


def test_the_run_config_takes_the_recorded_identity_over_the_defaults(tmp_path):
    """A run from before config.json: its checkpoint's identity over the defaults."""
    config = trained_run.run_config(
        tmp_path, {"task": "sst2", "rank": 4, "lora_targets": ["value"], "algorithm": "fedavg",
                   "backbone": "tiny", "lora_alpha": None}, data_dir="d", frozen_dir=None)
    assert (config.task.task, config.model.rank, config.model.lora_targets) == (
        "sst2", 4, ("value",))
    assert config.algorithm.algorithm == ("fedavg",)
    assert config.task.data_dir == "d" and config.model.client_ranks is None
    assert config.model.lora_alpha is None  # a recorded None keeps the default


def test_the_run_config_of_a_run_with_config_json_is_that_file(tmp_path):
    saved = RunConfig().with_changes(task="sst2", client_ranks=[2, 8], data_dir="x",
                                     algorithm=["flora"])
    (tmp_path / "config.json").write_text(saved.to_json())
    config = trained_run.run_config(tmp_path, {}, data_dir=None, frozen_dir=None)
    assert config == saved.with_changes(rank=8, client_ranks=None)


def _checkpoint(folder, round_num, task):
    """A checkpoint folder as `tffl.simulation.checkpoint` lists it (its meta.json)."""
    path = folder / "checkpoints" / f"round_{round_num:06d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps(
        {"round": round_num, "config": {"task": task, "algorithm": "fedavg"}}))
    return path


def test_the_newest_checkpoint_is_the_highest_round(tmp_path):
    _checkpoint(tmp_path, 2, "sst2")
    newest = _checkpoint(tmp_path, 10, "sst2")
    folder, meta = trained_run.newest_checkpoint(tmp_path)
    assert folder == newest and meta["round"] == 10


def test_a_folder_without_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(RunConfig().to_json())
    with pytest.raises(ValueError, match=f"^run_dir={tmp_path}: no checkpoint under "
                                         "checkpoints/$"):
        trained_run.newest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="gone: no such folder$"):
        trained_run.newest_checkpoint(tmp_path / "gone")


def test_the_output_folder_of_a_comparison_names_its_runs(tmp_path):
    config = RunConfig().with_changes(algorithm=["rolora", "fedavg_lora"],
                                      output_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(config.to_json())
    for name in ("rolora", "fedavg_lora"):
        _checkpoint(tmp_path / name, 1, "instruct")
    (tmp_path / "tensorboard").mkdir()   # not a run
    with pytest.raises(ValueError) as error:
        trained_run.newest_checkpoint(tmp_path)
    assert str(error.value) == (
        f"run_dir={tmp_path}: the output folder of a comparison of 2 runs; pass one of their "
        f"folders: {tmp_path / 'fedavg_lora'}, {tmp_path / 'rolora'}")


def test_a_check_refuses_the_run_before_anything_is_built(tmp_path):
    _checkpoint(tmp_path, 1, "mnist")

    def refuse(recorded):
        raise ValueError(f"task {recorded['task']!r}: refused")

    with pytest.raises(ValueError, match="^task 'mnist': refused$"):
        trained_run.trained_model(tmp_path, check=refuse)
