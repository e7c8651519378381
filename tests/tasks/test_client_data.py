"""Tests for tasks.client_data: elements equal numpy slices on both code paths; batching."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tasks import client_data


def _features():
    rng = np.random.default_rng(0)
    return rng.standard_normal((20, 3)).astype(np.float32), np.arange(20) % 4


def test_client_datasets_yield_numpy_slices():
    x, y = _features()
    parts = {"a": np.array([3, 1, 7]), "b": np.arange(10, 20)}
    cd = client_data.ArrayClientData(x, y, parts)
    assert cd.client_ids == ["a", "b"]
    assert cd.client_size("b") == 10
    got = list(cd.create_tf_dataset_for_client("a").as_numpy_iterator())
    assert len(got) == 3
    for (gx, gy), j in zip(got, [3, 1, 7]):
        np.testing.assert_array_equal(gx, x[j])
        assert gy == y[j] and gy.dtype == np.int32
    spec_x, spec_y = cd.element_type_structure
    assert spec_x.shape == (3,) and spec_x.dtype == tf.float32
    assert spec_y.shape == () and spec_y.dtype == tf.int32


def test_serializable_path_matches_python_path_for_dict_features():
    rng = np.random.default_rng(1)
    feats = {"token_ids": rng.integers(0, 50, (12, 5)).astype(np.int32),
             "padding_mask": rng.integers(0, 2, (12, 5)).astype(np.int32)}
    labels = rng.integers(0, 2, 12)
    parts = {"c0": np.array([0, 5]), "c1": np.array([11, 2, 3]), "c2": np.array([7])}
    cd = client_data.ArrayClientData(feats, labels, parts)
    for cid, idx in parts.items():
        graph = list(cd.serializable_dataset_fn(tf.constant(cid)).as_numpy_iterator())
        assert len(graph) == len(idx)
        for (gx, gy), j in zip(graph, idx):
            np.testing.assert_array_equal(gx["token_ids"], feats["token_ids"][j])
            np.testing.assert_array_equal(gx["padding_mask"], feats["padding_mask"][j])
            assert gy == labels[j]
    everything = list(cd.create_tf_dataset_from_all_clients(seed=0).as_numpy_iterator())
    assert sorted(int(y) for _, y in everything) == sorted(labels[[0, 5, 11, 2, 3, 7]].tolist())


def test_float_targets_are_float32():
    cd = client_data.ArrayClientData(np.ones((4, 2)), np.array([0.5, 1.5, 2.5, 3.5]),
                                     {"r": np.arange(4)})
    assert cd.element_type_structure[1].dtype == tf.float32
    np.testing.assert_allclose(cd.client_labels("r"), [0.5, 1.5, 2.5, 3.5])


def test_invalid_inputs_fail_clearly():
    x, y = _features()
    with pytest.raises(ValueError, match="client 'e' has no examples"):
        client_data.ArrayClientData(x, y, {"e": np.array([], int)})
    with pytest.raises(ValueError, match="outside"):
        client_data.ArrayClientData(x, y, {"a": np.array([20])})
    with pytest.raises(ValueError, match="20 feature rows but 3 labels"):
        client_data.ArrayClientData(x, y[:3], {"a": np.array([0])})
    with pytest.raises(ValueError, match="different numbers of rows"):
        client_data.ArrayClientData({"a": x, "b": x[:5]}, y, {"a": np.array([0])})
    cd = client_data.ArrayClientData(x, y, {"a": np.array([0])})
    with pytest.raises(ValueError, match="not a client"):
        cd.create_tf_dataset_for_client("zzz")


def test_preprocess_fn_batches_and_shuffles_deterministically():
    x, y = _features()
    cd = client_data.ArrayClientData(x, y, {"a": np.arange(20)})
    fn = client_data.preprocess_fn(batch_size=6, num_epochs=2, shuffle_buffer=20, seed=3)
    batched = cd.preprocess(fn)
    batches = list(batched.create_tf_dataset_for_client("a").as_numpy_iterator())
    # 2 epochs x 20 examples in batches of 6: 6,6,6,6,6,6,4.
    assert [len(b[1]) for b in batches] == [6, 6, 6, 6, 6, 6, 4]
    seen = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(np.bincount(seen), 2 * np.bincount(y))
    again = list(batched.create_tf_dataset_for_client("a").as_numpy_iterator())
    np.testing.assert_array_equal(seen, np.concatenate([b[1] for b in again]))
    assert not np.array_equal(seen[:20], y)  # shuffled
    unshuffled = client_data.preprocess_fn(batch_size=20)
    (bx, by), = unshuffled(cd.create_tf_dataset_for_client("a")).as_numpy_iterator()
    np.testing.assert_array_equal(by, y)
    np.testing.assert_array_equal(bx, x)


def test_tensor_dataset():
    x, y = _features()
    ds = client_data.tensor_dataset(x, y)
    assert ds.cardinality().numpy() == 20
    (fx, fy) = next(ds.as_numpy_iterator())
    np.testing.assert_array_equal(fx, x[0])
    assert fy == y[0]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
