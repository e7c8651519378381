"""A KerasNLP task model (`keras_nlp.models.BertClassifier`, which compiles itself with
`jit_compile`) as a user would bring it: LoRA on its backbone, its `logits` layer tagged `head`,
trained by RoLoRA on TFF. The B round and the A round are checked against an eager-TensorFlow
RoLoRA written from the paper (its own SGD loop). FedRep's personal heads over RoLoRA-averaged
adapters on a KerasNLP BERT backbone, against an eager-TensorFlow FedRep the same way."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models import lora_targets
from tests.tffl.algorithms import eager_reference
from tests.tffl.algorithms.personalized_models import lora_classifier
from tffl.algorithms import lora_fl
from tffl.algorithms import personalized
from tffl.engine import roles

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


@pytest.mark.large
def test_rolora_trains_a_bert_classifier_with_its_tagged_head():
    process = lora_fl.build_rolora(_bert_classifier, SPEC, LR)
    spec = process.spec
    a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
    head = spec.indices([roles.HEAD])
    assert len(a_idx) == len(b_idx) == 2 and len(head) == 2   # query/value; logits kernel, bias
    datasets = [_dataset(1), _dataset(2)]
    # B ≠ 0 (so that the A round moves A) and a head of unit scale (BERT's 0.02 would leave the
    # adapters' steps at float32 round-off in this tiny network).
    start, mid, after_a = eager_reference.rolora_two_rounds(process, datasets, b_idx + head[:1],
                                                            1.0)
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


# ---- FedRep heads over RoLoRA adapters on a KerasNLP backbone ---------------------------------

def _reference_fedrep_round(model_fn, weights, heads, head_idx, rep_idx, datasets, lr):
    """FedRep's round written from the paper in eager TensorFlow (`eager_reference`): each
    client loads the weights and its head, takes one SGD epoch on the head, then one on the
    `rep_idx` variables; returns every client's trained trainable values (numpy)."""
    model = model_fn()
    out = []
    for dataset, head in zip(datasets, heads):
        values = list(weights.trainable)
        for k, v in zip(head_idx, head):
            values[k] = v
        out.append(eager_reference.sgd_phases(model, values, weights.non_trainable,
                                              (head_idx, rep_idx), dataset, lr))
    return out


@pytest.mark.large  # the fast tier trains the KerasNLP classifier with RoLoRA above
def test_fedrep_heads_over_rolora_alternating_lora_on_a_kerasnlp_backbone(tff_runtime):
    """The combination the papers never ran: FedRep heads, LoRA adapters on a KerasNLP BERT
    representation, averaged RoLoRA-style. In the B round A is fixed and B is averaged; in the
    A round the reverse; every client's head is trained and kept personal. Both rounds' factors
    and heads equal an eager-TensorFlow FedRep written from the paper (its own SGD loop)."""
    x_spec = collections.OrderedDict(
        padding_mask=tf.TensorSpec([None, 8], tf.int32),
        segment_ids=tf.TensorSpec([None, 8], tf.int32),
        token_ids=tf.TensorSpec([None, 8], tf.int32))
    spec = (x_spec, tf.TensorSpec([None], tf.int32))
    process = personalized.build_personalized_process(
        "fedrep", lora_classifier, spec, 0.5, lora_schedule="alternating")
    assert list(process.rounds) == ["b_round", "a_round"]
    info = process.spec.trainable
    a_idx = process.spec.indices([roles.LORA_A])
    b_idx = process.spec.indices([roles.LORA_B])
    head = process.evaluation.personal_indices
    assert {info[k].role for k in head} == {roles.HEAD}
    # The federated weights are the LoRA factors (the head is personal, the rest frozen).
    assert sorted(process.model.layout.trainable) == sorted(a_idx + b_idx)
    # Each round uploads one factor of every adapter: half of the factors' bytes; both rounds
    # receive both factors.
    factor_bytes = {name: sum(4 * np.prod(info[k].shape) for k in idx)
                    for name, idx in (("b_round", b_idx), ("a_round", a_idx))}
    for name in ("b_round", "a_round"):
        assert process.traffic[name].up == factor_bytes[name] + 16
        assert process.traffic[name].down == factor_bytes["b_round"] + factor_bytes["a_round"]

    def dataset(seed):
        r = np.random.default_rng(seed)
        x = collections.OrderedDict(
            padding_mask=np.ones((6, 8), np.int32), segment_ids=np.zeros((6, 8), np.int32),
            token_ids=r.integers(1, 50, (6, 8)).astype(np.int32))
        return tf.data.Dataset.from_tensor_slices((x, r.integers(0, 3, 6).astype(np.int32))
                                                  ).batch(3)

    datasets = [dataset(s) for s in (1, 2)]
    # Start from B ≠ 0 (as after some training): with B = 0 an A step is exactly zero, and in
    # this tiny random network one B round moves B by only ~1e-6.
    state = process.initialize()
    weights = process.model_weights(state)
    rng = np.random.default_rng(0)
    trainable = [rng.normal(0, 0.3, w.shape).astype(np.float32) if k in b_idx else w
                 for k, w in enumerate(weights.trainable)]
    state = process.with_model_weights(state, tff.learning.models.ModelWeights(
        trainable, list(weights.non_trainable)))
    before = process.model_weights(state).trainable
    for k in b_idx:
        np.testing.assert_array_equal(before[k], trainable[k])
    # One call of `next_round` is one communication round: first a B round, then an A round.
    assert process.round_name(state) == "b_round"
    b_only = process.next_round(state, datasets, [process.initialize_personal("x")] * 2)
    assert list(b_only.metrics) == ["b_round"]
    assert process.round_num(b_only.state) == 1
    after_b = process.model_weights(b_only.state).trainable
    for k in a_idx:
        np.testing.assert_array_equal(after_b[k], before[k])
    assert any(not np.array_equal(after_b[k], before[k]) for k in b_idx)
    heads = b_only.personal_states
    assert not np.array_equal(heads[0][0], heads[1][0])   # personal, not averaged
    assert np.isfinite(b_only.metrics["b_round"]["client_work"]["train"]["loss"])
    assert process.round_name(b_only.state) == "a_round"
    out = process.next_round(b_only.state, datasets, heads)
    assert list(out.metrics) == ["a_round"]
    assert process.round_num(out.state) == 2
    after = process.model_weights(out.state).trainable
    assert any(not np.array_equal(after[k], after_b[k]) for k in a_idx)
    for k in b_idx:   # the reverse: B is fixed in the A round
        np.testing.assert_array_equal(after[k], after_b[k])
    # The heads never reach the server: its weights assemble with the model's initial head.
    np.testing.assert_array_equal(after[head[0]], before[head[0]])
    assert not np.array_equal(out.personal_states[0][0], out.personal_states[1][0])
    assert np.isfinite(out.metrics["a_round"]["client_work"]["train"]["loss"])
    assert process.round_name(out.state) == "b_round"

    # The numbers: the B round, then the A round, against the eager reference (equal client
    # sizes, so the example-weighted mean is the plain mean). The moves are compared, relative
    # to their size, since a round moves the factors little.
    def assert_moved_alike(got, start, expected):
        move, expected_move = np.asarray(got) - start, np.asarray(expected) - start
        assert np.abs(expected_move).max() > 0
        np.testing.assert_allclose(move, expected_move, rtol=0,
                                   atol=1e-3 * np.abs(expected_move).max())

    full = process.model_weights(state)
    initial_heads = [[full.trainable[k] for k in head]] * 2
    ref_b = _reference_fedrep_round(lora_classifier, full, initial_heads, head, b_idx,
                                    datasets, 0.5)
    for k in b_idx:
        assert_moved_alike(after_b[k], before[k], np.mean([c[k] for c in ref_b], axis=0))
    for client, personal in zip(ref_b, heads):
        for k, value in zip(head, personal):
            assert_moved_alike(value, full.trainable[k], client[k])
    ref_a = _reference_fedrep_round(lora_classifier, process.model_weights(b_only.state),
                                    heads, head, a_idx, datasets, 0.5)
    for k in a_idx:
        assert_moved_alike(after[k], after_b[k], np.mean([c[k] for c in ref_a], axis=0))
    for client, personal, start in zip(ref_a, out.personal_states, heads):
        for k, value, initial in zip(head, personal, start):
            assert_moved_alike(value, initial, client[k])
