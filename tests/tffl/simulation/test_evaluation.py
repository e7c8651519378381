"""`make_keras_evaluator`: both loops equal numpy's cross-entropy and accuracy; an empty dataset
is a one-line error, not a division by zero; one graph per batch is traced once."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tffl.simulation import evaluation


def _model():
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])


@pytest.mark.parametrize("graph_per_batch", [False, True])
def test_totals_equal_numpy(graph_per_batch):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 3)).astype(np.float32), rng.integers(0, 2, 7)
    kernel, bias = rng.normal(size=(3, 2)).astype(np.float32), np.zeros(2, np.float32)
    weights = tff.learning.models.ModelWeights([kernel, bias], [])
    evaluate = evaluation.make_keras_evaluator(
        _model, tf.data.Dataset.from_tensor_slices((x, y)).batch(3),
        graph_per_batch=graph_per_batch)
    logits = x.astype(np.float64) @ kernel
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    got = evaluate(weights)
    np.testing.assert_allclose(got["loss"], -log_p[np.arange(7), y].mean(), rtol=1e-5)
    assert got["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y))


@pytest.mark.parametrize("graph_per_batch", [False, True])
def test_an_empty_dataset_is_a_one_line_error(graph_per_batch):
    empty = tf.data.Dataset.from_tensor_slices(
        (np.zeros((0, 3), np.float32), np.zeros(0, np.int64))).batch(3)
    evaluate = evaluation.make_keras_evaluator(_model, empty, graph_per_batch=graph_per_batch)
    weights = tff.learning.models.ModelWeights([np.zeros((3, 2), np.float32),
                                                np.zeros(2, np.float32)], [])
    with pytest.raises(ValueError, match="no examples"):
        evaluate(weights)


def test_one_graph_per_batch_is_traced_once_for_batches_of_every_size():
    """Batches of 3, 3 and 1 rows, evaluated twice: the graph is traced once (for the dataset's
    element spec), not again for the smaller last batch."""
    traced = []

    def counting_model():
        def count(t):
            traced.append(t.shape.as_list())
            return t
        return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Lambda(count),
                                    tf.keras.layers.Dense(2)])

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, 3)).astype(np.float32), rng.integers(0, 2, 7)
    evaluate = evaluation.make_keras_evaluator(
        counting_model, tf.data.Dataset.from_tensor_slices((x, y)).batch(3), graph_per_batch=True)
    weights = tff.learning.models.ModelWeights([np.ones((3, 2), np.float32),
                                                np.zeros(2, np.float32)], [])
    first = evaluate(weights)
    assert evaluate(weights) == first
    # The model's build, then one trace (traced at the first batch's shape, the graph was
    # traced again for the last batch: [[None, 3], [3, 3], [None, 3]]).
    assert traced == [[None, 3], [None, 3]]
