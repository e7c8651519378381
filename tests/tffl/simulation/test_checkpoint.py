"""tffl.simulation.checkpoint: exact round-trips, atomic writes, clear mismatch errors."""

import collections

import attrs
import numpy as np
import pytest

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
