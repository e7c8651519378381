"""tasks.run_task.starting_non_trainable: the starting frozen weights computed once, not held
between calls but read back from their fingerprinted file."""

import numpy as np
import tensorflow as tf

from tasks import run_task
from tffl.engine import frozen

_SPEC = tf.TensorSpec([None, 3], tf.float32)


def _model_fn():
    x = tf.keras.Input((3,))
    body = tf.keras.layers.Dense(4, name="body")
    body.trainable = False
    return tf.keras.Model(x, tf.keras.layers.Dense(2, name="head")(body(x)))


def test_pretrained_values_are_computed_once_and_read_back_from_their_file(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TFFL_FROZEN_DIR", str(tmp_path))
    given = [np.arange(12, dtype=np.float32).reshape(3, 4), np.full(4, -1.5, np.float32)]
    calls = []

    def pretrained():
        calls.append(1)
        return [v.copy() for v in given]

    values = run_task.starting_non_trainable(_model_fn, _SPEC, pretrained, "the test model")
    first, second = values(), values()
    assert len(calls) == 1
    for a, b, want in zip(first, second, given, strict=True):
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, want)
        assert b is not a   # read back, not the first call's arrays kept
    assert (tmp_path / frozen.fingerprint(given) / "weights.index").is_file()


def test_without_a_checkpoint_the_model_draws_its_own_values_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TFFL_FROZEN_DIR", str(tmp_path))
    values = run_task.starting_non_trainable(_model_fn, _SPEC)
    first, second = values(), values()
    assert [v.shape for v in first] == [(3, 4), (4,)]
    assert np.abs(first[0]).sum() > 0   # the Dense kernel's random draw, not zeros
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)   # one draw, not a draw per call


def test_an_unwritable_folder_keeps_the_values_in_memory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TFFL_FROZEN_DIR", str(blocked / "frozen"))
    given = [np.ones((2, 2), np.float32)]
    calls = []
    values = run_task.starting_non_trainable(
        _model_fn, _SPEC, lambda: calls.append(1) or [v.copy() for v in given])
    first, second = values(), values()
    assert len(calls) == 1 and second is first
    np.testing.assert_array_equal(second[0], given[0])


def test_a_cleaned_cache_computes_the_values_again(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("TFFL_FROZEN_DIR", str(tmp_path))
    given = [np.full((2, 3), 0.5, np.float32)]
    calls = []
    values = run_task.starting_non_trainable(
        _model_fn, _SPEC, lambda: calls.append(1) or [v.copy() for v in given])
    values()
    shutil.rmtree(tmp_path / frozen.fingerprint(given))
    again = values()
    assert len(calls) == 2
    np.testing.assert_array_equal(again[0], given[0])
    assert (tmp_path / frozen.fingerprint(given) / "weights.index").is_file()   # written anew
