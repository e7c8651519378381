"""A KerasNLP task model (`keras_nlp.models.BertClassifier`, which compiles itself with
`jit_compile`) as a user would bring it: LoRA on its backbone, its `logits` layer tagged `head`,
trained by RoLoRA on TFF. The B round and the A round are checked against an eager-TensorFlow
RoLoRA written from the paper (its own SGD loop)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from models import lora_targets
from tests.tffl.algorithms import eager_reference
from tffl.algorithms import lora_fl
from tffl.engine import roles
from tffl import runtime

LENGTH = 8
# Large enough that every value-adapter and head step is ≥ 16× the strict threshold below
# (with the seeded weights of `_bert_classifier`), and the A round's query step 4×.
LR = 4.0
SPEC = (collections.OrderedDict(
    padding_mask=tf.TensorSpec([None, LENGTH], tf.int32),
    segment_ids=tf.TensorSpec([None, LENGTH], tf.int32),
    token_ids=tf.TensorSpec([None, LENGTH], tf.int32)), tf.TensorSpec([None], tf.int32))


def _bert_classifier(tag_head=True):
    import keras_nlp

    # Seeds the graph the model is built in (`tffl.engine.frozen.initial_values` draws its initial
    # weights there), so the backbone and head, and with them every step below, are the same on
    # every run.
    tf.keras.utils.set_random_seed(0)
    backbone = keras_nlp.models.BertBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=LENGTH, dropout=0.0)
    lora_targets.apply_lora(backbone, lora_targets.LoraConfig(rank=2, targets=("query", "value")))
    lora_targets.freeze_non_lora(backbone)
    classifier = keras_nlp.models.BertClassifier(backbone, num_classes=2, preprocessor=None,
                                                 dropout=0.0)
    if tag_head:
        roles.tag_layer(classifier.get_layer("logits"), roles.HEAD)
    return classifier


def _dataset(seed, n=6):
    rng = np.random.default_rng(seed)
    x = collections.OrderedDict(
        padding_mask=np.ones((n, LENGTH), np.int32), segment_ids=np.zeros((n, LENGTH), np.int32),
        token_ids=rng.integers(1, 50, (n, LENGTH)).astype(np.int32))
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 2, n).astype(np.int32))).batch(3)


def _reference_round(weights, train_idx, datasets, lr):
    """Eager RoLoRA round (`eager_reference`): every client loads the weights, takes one SGD pass
    over its batches on `train_idx`; the mean of the clients' values."""
    model = _bert_classifier()
    finals = [eager_reference.sgd_phases(model, weights.trainable, weights.non_trainable,
                                         (train_idx,), dataset, lr) for dataset in datasets]
    return [np.mean([f[k] for f in finals], axis=0) for k in range(len(finals[0]))]


def test_rolora_trains_a_bert_classifier_with_its_tagged_head():
    process = lora_fl.build_rolora(_bert_classifier, SPEC, LR)
    spec = process.spec
    a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
    head = spec.indices([roles.HEAD])
    assert len(a_idx) == len(b_idx) == 2 and len(head) == 2   # query/value; logits kernel, bias
    datasets = [_dataset(1), _dataset(2)]
    with runtime.local_runtime():
        state = process.initialize()
        weights = process.model_weights(state)
        # B ≠ 0 (so that the A round moves A) and a head of unit scale (BERT's 0.02 would
        # leave the adapters' steps at float32 round-off in this tiny network).
        rng = np.random.default_rng(0)
        trainable = [rng.normal(0, 1.0, w.shape).astype(np.float32) if k in b_idx + head[:1]
                     else w for k, w in enumerate(weights.trainable)]
        state = process.with_model_weights(state, type(weights)(trainable,
                                                                 list(weights.non_trainable)))
        start = process.model_weights(state)
        after_b = process.next_round(state, datasets).state
        mid = process.model_weights(after_b)
        after_a = process.model_weights(process.next_round(after_b, datasets).state)
    expected_b = _reference_round(start, sorted(b_idx + head), datasets, LR)
    expected_a = _reference_round(mid, sorted(a_idx + head), datasets, LR)
    for got, expected, before, moved in ((mid, expected_b, start, b_idx + head),
                                         (after_a, expected_a, mid, a_idx + head)):
        # In this tiny random BERT the attention is nearly uniform, so the query adapters'
        # steps can be ~1e-5 (float32 round-off of the weights is ~1e-7): a step under 1e-4 of
        # its variable's scale is checked as values; every other step (value adapter, head, and
        # the A round's query factor) must match the reference's to 0.1%.
        strict = 0
        for k in moved:
            step = np.asarray(expected[k]) - before.trainable[k]
            if np.abs(step).max() > 1e-4 * np.abs(before.trainable[k]).max():
                strict += 1
                np.testing.assert_allclose(got.trainable[k] - before.trainable[k], step,
                                           atol=1e-3 * np.abs(step).max())
            else:
                np.testing.assert_allclose(got.trainable[k], expected[k], rtol=0, atol=1e-6)
        assert strict >= 3, strict   # value adapter factor, head kernel and bias
        for k in set(range(len(got.trainable))) - set(moved):
            np.testing.assert_array_equal(got.trainable[k], before.trainable[k])
        for x, y in zip(got.non_trainable, before.non_trainable):
            np.testing.assert_array_equal(x, y)   # the backbone never moves


def test_an_untagged_trainable_head_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"logits/kernel.*no round of rolora trains it.*"
                                         r"tffl\.engine\.roles\.tag"):
        lora_fl.build_rolora(lambda: _bert_classifier(tag_head=False), SPEC, 0.5)
