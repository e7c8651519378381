"""tffl.simulation.checkpoint: exact round-trips, atomic writes, clear mismatch errors."""

import collections
import json
import types

import attrs
import numpy as np
import pytest
import tensorflow as tf

from tffl.simulation import checkpoint


@attrs.define
class _State:
    weights: list
    step: np.ndarray
    opt: collections.OrderedDict


def _state(scale=1.0):
    return _State(
        weights=[np.arange(6, dtype=np.float32).reshape(2, 3) * scale, np.ones(3, np.float32)],
        step=np.int64(7),
        opt=collections.OrderedDict(lr=np.float32(0.1), empty=()),
    )


def test_round_trip_is_exact(tmp_path):
    state = _state(scale=np.float32(1 / 3))
    checkpoint.save(tmp_path, 4, state, config={"seed": 1}, extra={"store": np.eye(2)})
    round_num, path = checkpoint.latest(tmp_path)
    assert round_num == 4
    loaded, extra, meta = checkpoint.load(path, template=_state())
    assert isinstance(loaded, _State)
    np.testing.assert_array_equal(loaded.weights[0], state.weights[0])  # bit-exact
    assert loaded.weights[0].dtype == np.float32 and loaded.step == 7
    np.testing.assert_array_equal(extra["store"], np.eye(2))
    assert meta["config"] == {"seed": 1} and meta["round"] == 4


def test_keeps_only_newest_and_leaves_no_temp_dirs(tmp_path):
    for r in range(1, 6):
        checkpoint.save(tmp_path, r, _state(r), keep=2)
    assert checkpoint.list_rounds(tmp_path) == [4, 5]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp_")]


def test_incomplete_checkpoint_is_ignored(tmp_path):
    checkpoint.save(tmp_path, 1, _state())
    (tmp_path / "round_000002").mkdir()  # e.g. a copy interrupted before meta.json
    assert checkpoint.latest(tmp_path)[0] == 1


def test_mismatched_structure_or_shape_is_a_clear_error(tmp_path):
    checkpoint.save(tmp_path, 1, _state())
    _, path = checkpoint.latest(tmp_path)
    other = _state()
    other.weights[0] = np.zeros((3, 3), np.float32)
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"shape \(2, 3\).*\(3, 3\)"):
        checkpoint.load(path, template=other)
    with pytest.raises(checkpoint.CheckpointMismatchError, match="holds 4 state tensors"):
        checkpoint.load(path, template=[np.zeros(1)])


def test_no_checkpoint():
    assert checkpoint.latest("/nonexistent/dir") is None


# -- arrays named by what they hold ------------------------------------------------------------

_NAMES = {"weights": ["dense/kernel", "dense/bias"]}


def _arrays(path):
    with np.load(path / "state.npz") as arrays:
        return {k: arrays[k] for k in arrays.files}


def test_arrays_are_named_by_structure_path_and_variable(tmp_path):
    state = _state()
    path = checkpoint.save(tmp_path, 1, state, variable_names=_NAMES)
    names = ["weights/dense/kernel", "weights/dense/bias", "step", "opt/lr"]
    assert sorted(_arrays(path)) == sorted(names)
    np.testing.assert_array_equal(_arrays(path)["weights/dense/kernel"], state.weights[0])
    meta = json.loads((path / "meta.json").read_text())
    assert meta["names"] == names and meta["paths"] == ["weights/0", "weights/1", "step", "opt/lr"]
    # Without variable names: the structure paths.
    path = checkpoint.save(tmp_path, 2, state)
    assert sorted(_arrays(path)) == sorted(["weights/0", "weights/1", "step", "opt/lr"])
    for names in (_NAMES, None):   # restored by position, with or without the variable names
        loaded, _, _ = checkpoint.load(path, template=_state(2.0), variable_names=names)
        np.testing.assert_array_equal(loaded.weights[0], state.weights[0])


def test_a_name_shared_by_two_variables_keeps_their_positions(tmp_path):
    path = checkpoint.save(tmp_path, 1, _state(), variable_names={"weights": ["w", "w"]})
    assert {"weights/0/w", "weights/1/w"} <= set(_arrays(path))


def test_a_checkpoint_that_does_not_name_its_arrays_is_refused(tmp_path):
    """A checkpoint as `checkpoint.save` wrote it before the names (arrays `leaf_00000`, ...,
    no `names` or `paths` in meta.json) cannot be checked against a process: one line says so."""
    leaves = [np.asarray(leaf) for leaf in tf.nest.flatten(_state())]
    path = tmp_path / "round_000005"
    path.mkdir()
    np.savez(path / "state.npz", **{f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)})
    np.savez(path / "extra.npz")
    (path / "meta.json").write_text(json.dumps({"round": 5, "num_leaves": len(leaves)}))
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match="does not name its arrays.*fresh --output_dir") as error:
        checkpoint.load(path, template=_state(), variable_names=_NAMES)
    assert "\n" not in str(error.value)


def test_another_variable_or_structure_is_a_one_line_error_naming_it(tmp_path):
    path = checkpoint.save(tmp_path, 1, _state(), variable_names=_NAMES)
    renamed = {"weights": ["dense/kernel", "dense_1/bias"]}
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=r"state tensor 1 is weights/dense/bias there but "
                             r"weights/dense_1/bias in this process") as error:
        checkpoint.load(path, template=_state(), variable_names=renamed)
    assert "\n" not in str(error.value)
    other = _state()
    other.opt = collections.OrderedDict(momentum=np.float32(0.1))  # same count and shapes
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match="state tensor 3 is opt/lr there but opt/momentum"):
        checkpoint.load(path, template=other)
    other = _state()
    other.weights[0] = np.zeros((3, 3), np.float32)
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=r"weights/dense/kernel \(state tensor 0\) has shape \(2, 3\)"):
        checkpoint.load(path, template=other)


def test_variable_names_of_a_process_are_its_federated_variables():
    spec = types.SimpleNamespace(
        trainable=[types.SimpleNamespace(name=n) for n in ("l/kernel:0", "l/lora_a:0",
                                                            "l/lora_b:0")],
        non_trainable=[types.SimpleNamespace(name="norm/moving_mean:0")])
    layout = types.SimpleNamespace(spec=spec, trainable=(1, 2), non_trainable=(0,))
    process = types.SimpleNamespace(model=types.SimpleNamespace(layout=layout))
    assert checkpoint.variable_names(process) == {
        "global_model_weights/trainable": ["l/lora_a", "l/lora_b"],
        "global_model_weights/non_trainable": ["norm/moving_mean"]}
    assert checkpoint.variable_names(types.SimpleNamespace(model=None)) is None
    assert checkpoint.variable_names(object()) is None
