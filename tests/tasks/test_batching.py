"""tasks.batching: the same examples in every grouping, and variable-length batches kept intact."""

import collections

import numpy as np
import pytest

from tasks import batching


def test_round_example_ids_repeat_a_full_shuffle():
    ids = batching.round_example_ids(num_examples=7, local_steps=4, batch_size=4, seed=3)
    assert len(ids) == 16
    np.testing.assert_array_equal(np.sort(ids[:7]), np.arange(7))  # a permutation first
    np.testing.assert_array_equal(ids[7:14], ids[:7])               # then the same again
    other = batching.round_example_ids(num_examples=7, local_steps=4, batch_size=4, seed=4)
    assert not np.array_equal(ids, other)
    with pytest.raises(ValueError, match="no training examples"):
        batching.round_example_ids(0, 1, 1, 0)


@pytest.mark.parametrize("num_examples", [5, 12_345])  # 12,345: more than SHUFFLE_BUFFER
def test_round_example_ids_are_the_classic_pipelines_order(num_examples):
    import tensorflow as tf

    classic = (tf.data.Dataset.range(num_examples)
               .shuffle(batching.SHUFFLE_BUFFER, seed=11, reshuffle_each_iteration=False)
               .repeat().take(3 * 7))
    np.testing.assert_array_equal(
        batching.round_example_ids(num_examples, local_steps=3, batch_size=7, seed=11),
        [int(i) for i in classic])


def test_length_bucketed_batches_hold_the_same_examples_sorted_by_length():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 50)
    ids = rng.integers(0, 50, 40)  # repeats allowed, as in a round of a small client
    batches = batching.length_bucketed(ids, lengths, 8, seed=1)
    assert [len(b) for b in batches] == [8] * 5
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.sort(ids))
    spans = sorted((lengths[b].min(), lengths[b].max()) for b in batches)
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        assert hi <= lo  # batches do not overlap in length
    assert batching.in_order(np.arange(5), 2)[-1].tolist() == [4]


def test_variable_length_dataset_returns_each_batch_unchanged():
    rng = np.random.default_rng(1)
    batches = []
    for rows, length in ((4, 3), (4, 7), (2, 1)):
        x = collections.OrderedDict(hidden=rng.normal(size=(rows, length, 5)).astype(np.float32),
                                    padding_mask=np.ones((rows, length), np.int32))
        batches.append((x, rng.integers(0, 2, rows).astype(np.int32)))
    dataset = batching.variable_length_dataset(batches)
    x_spec, y_spec = dataset.element_spec
    assert x_spec["hidden"].shape.as_list() == [None, None, 5]
    assert x_spec["padding_mask"].shape.as_list() == [None, None]
    assert y_spec.shape.as_list() == [None]
    got = list(dataset.as_numpy_iterator())
    assert len(got) == 3
    for (x, y), (wx, wy) in zip(got, batches):
        np.testing.assert_array_equal(y, wy)
        for key in wx:
            np.testing.assert_array_equal(x[key], wx[key])
    with pytest.raises(ValueError, match="no batches"):
        batching.variable_length_dataset([])


def test_trim_to_longest_cuts_only_sequence_features():
    x = collections.OrderedDict(token_ids=np.ones((2, 9), np.int32), other=np.ones((2, 9)))
    cut, y = batching.trim_to_longest((x, np.zeros(2)), np.array([3, 5]), ("token_ids",))
    assert cut["token_ids"].shape == (2, 5) and cut["other"].shape == (2, 9)


def test_variable_length_dataset_from_files_reads_the_same_batches(tmp_path):
    rng = np.random.default_rng(2)
    batches = [(collections.OrderedDict(hidden=rng.normal(size=(3, n, 4)).astype(np.float32)),
                rng.integers(0, 5, 3).astype(np.int64)) for n in (2, 6)]
    dataset = batching.variable_length_dataset(batches, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feature_0.bin", "feature_1.bin"]
    for _ in range(2):  # iterated twice (e.g. two local epochs): the same batches
        got = list(dataset.as_numpy_iterator())
        assert len(got) == 2
        for (x, y), (wx, wy) in zip(got, batches):
            np.testing.assert_array_equal(x["hidden"], wx["hidden"])
            np.testing.assert_array_equal(y, wy)
    # The graph holds no batch data: it is small whatever the batches' size.
    assert len(dataset._as_serialized_graph().numpy()) < 20_000
