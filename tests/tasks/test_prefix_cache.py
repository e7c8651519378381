"""tasks.prefix_cache (+ models.prefix, tasks.batching) inside TFF rounds: training the suffix
on cached h_k must be the same computation as training the whole classifier on tokens.

The reference is the whole classifier run by the same TFF process on token batches; the check
is that every loss, every updated LoRA factor and every personal head agree to 1e-5, so a wrong
split (a missing layer, a wrong mask, a stale cache, a shifted weight) fails it.
"""

import collections
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from models import backbones
from models import lora_targets
from models import prefix as prefix_lib
from tasks import prefix_cache
from tffl.engine import frozen as frozen_lib
from tffl.algorithms import lora_fl
from tffl.algorithms import personalized

VOCAB, SEQ, K_STEPS, BATCH = 60, 12, 3, 4
LORA = lora_targets.LoraConfig(rank=2, targets=("query", "value"), layers=(2, 3), seed=0)
FULL_SPEC = (collections.OrderedDict(
    (k, tf.TensorSpec([None, None], tf.int32)) for k in ("padding_mask", "segment_ids",
                                                        "token_ids")),
             tf.TensorSpec([None], tf.int32))


def _full_model():
    backbone = backbones.build_bert_backbone(vocabulary_size=VOCAB, num_layers=4, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32,
                                             max_sequence_length=SEQ)
    lora_targets.apply_lora(backbone, LORA)
    return backbones.build_classifier(backbone, 2, seed=0)


def _clients(sizes=(9, 14, 7), seed=0):
    rng = np.random.default_rng(seed)
    clients = {}
    for i, n in enumerate(sizes):
        lengths = rng.integers(2, SEQ + 1, n)
        mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
        tokens = rng.integers(1, VOCAB, (n, SEQ)).astype(np.int32) * mask
        features = collections.OrderedDict(padding_mask=mask, segment_ids=np.zeros_like(mask),
                                           token_ids=tokens)
        clients[str(i)] = prefix_cache.ClientExamples(features, rng.integers(0, 2, n)
                                                      .astype(np.int32))
    return clients


@pytest.fixture(scope="module")
def setup():
    values = frozen_lib.initial_values(_full_model, FULL_SPEC)
    # B = 0 at initialization would hide a wrong A in a B round's gradients: start from B != 0.
    rng = np.random.default_rng(1)
    trainable = [v + 0.3 * rng.normal(size=v.shape).astype(v.dtype) for v in values[0]]
    # BERT's 0.02 init makes a tiny encoder nearly the identity, which would hide a wrong layer:
    # frozen matrices of std 0.3 make every layer count.
    values = (trainable, [v * 15 if v.ndim >= 2 else v for v in values[1]])
    cached = prefix_cache.split_for_cache(_full_model, lambda: values[1],
                                          prefix_cache.ClassifierLayout(LORA, 2, seed=0),
                                          label_spec=FULL_SPEC[1])
    with tf.Graph().as_default():
        positions = prefix_lib.matching_positions(_full_model(), cached.keras_model_fn())
    return values, cached, positions


def _rounds(cache=None, storage_dir=None):
    return prefix_cache.TextRounds(_clients(), prefix_cache.RoundDraw(K_STEPS, BATCH, seed=3),
                                   cache=cache, storage_dir=storage_dir)


def _build(algorithm, model_fn, spec, values, trainable_positions, non_trainable, **kwargs):
    trainable = [values[0][p] for p in trainable_positions]
    if algorithm == "fedrep":
        return personalized.build_personalized_process(
            "fedrep", model_fn, spec, 0.1, representation_epochs=1, head_epochs=1,
            initial_non_trainable=non_trainable, initial_trainable=trainable, **kwargs)
    return lora_fl.build_lora_process(algorithm, model_fn, spec, 0.1,
                                      initial_non_trainable=non_trainable,
                                      initial_trainable=trainable, **kwargs)


@pytest.mark.large  # 1.5 minutes each; the cache's parts are checked below in the fast tier
@pytest.mark.parametrize("algorithm", ["rolora", "fedrep"])
def test_cached_prefix_rounds_equal_the_whole_model(tff_runtime, setup, algorithm, tmp_path):
    values, cached, (trainable_positions, non_trainable_positions) = setup
    full = _build(algorithm, _full_model, FULL_SPEC, values, range(len(values[0])), values[1])
    suffix = _build(algorithm, cached.keras_model_fn, cached.input_spec, values,
                    trainable_positions, cached.non_trainable())
    # The suffix carries only the encoders from the lowest LoRA layer up.
    assert len(suffix.model.frozen.load()) < len(full.model.frozen.load())
    # The h_k rounds reach the worker as files (`storage_dir`), as the text tasks send them.
    tokens, states = _rounds(), _rounds(cached.cache, storage_dir=str(tmp_path))
    ids = tokens.client_ids
    full_state, suffix_state = full.initialize(), suffix.initialize()
    personal = None
    if algorithm == "fedrep":
        personal = [[p.initialize_personal(c) for c in ids] for p in (full, suffix)]
    for t in range(2):  # RoLoRA: a B round and an A round
        args_full = [[tokens.dataset(c, t) for c in ids]]
        args_suffix = [[states.dataset(c, t) for c in ids]]
        if algorithm == "fedrep":
            args_full.append(personal[0])
            args_suffix.append(personal[1])
        out_full = full.next_round(full_state, *args_full)
        out_suffix = suffix.next_round(suffix_state, *args_suffix)
        full_state, suffix_state = out_full.state, out_suffix.state
        loss_full = _leaf(out_full.metrics, "loss")
        assert np.isfinite(loss_full)
        np.testing.assert_allclose(_leaf(out_suffix.metrics, "loss"), loss_full, atol=1e-5)
        if algorithm == "fedrep":
            personal = [out_full.personal_states, out_suffix.personal_states]
            for a, b in zip(*personal):
                np.testing.assert_allclose(b[0], a[0], atol=1e-5)
    whole = full.model_weights(full_state).trainable
    part = suffix.model_weights(suffix_state).trainable
    moved = 0
    for k, p in enumerate(trainable_positions):
        np.testing.assert_allclose(part[k], whole[p], atol=1e-5)
        moved += not np.allclose(whole[p], values[0][p])
    assert moved >= 2  # the rounds did train something
    # Round t's files are removed once round t + 2 is written; round 1's are still there.
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["0", "1"]
    # Each example went through the prefix once, however many rounds used it.
    assert cached.cache.computed == cached.cache.examples_cached <= sum(
        len(_rounds().examples(c)) for c in ids)


def _leaf(metrics, name):
    found = [v for path, v in _flatten(metrics) if path.endswith(name)]
    assert found, metrics
    return float(found[0])


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}/{k}")
    else:
        yield prefix, tree


def test_bucketed_and_padded_batches_give_the_same_per_example_loss():
    model = _full_model()
    examples = _clients()["1"]
    ids = np.arange(len(examples))
    padded, labels = examples.batch(ids, trim=False)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    whole = loss(labels, model(dict(padded))).numpy()
    rounds = prefix_cache.TextRounds({"1": examples}, prefix_cache.RoundDraw(1, 3, seed=0))
    got = np.zeros_like(whole)
    for batch_ids in prefix_cache.batching.length_bucketed(ids, examples.lengths, 3, seed=0):
        features, y = examples.batch(batch_ids, trim=True)
        assert features["token_ids"].shape[1] == examples.lengths[batch_ids].max()
        got[batch_ids] = loss(y, model(dict(features))).numpy()
    np.testing.assert_allclose(got, whole, atol=1e-5)
    assert rounds.examples("1") is examples


def test_classic_path_keeps_the_tf_data_pipelines_batches():
    """Without bucketing, a round is the tf.data pipeline the text tasks always used."""
    examples = _clients()["2"]
    rounds = prefix_cache.TextRounds({"a": examples, "b": examples}, prefix_cache.RoundDraw(
        K_STEPS, BATCH, seed=5, bucket_by_length=False))
    shuffle_seed, _ = rounds._seeds("b", 4)
    pipeline = (tf.data.Dataset.from_tensor_slices((dict(examples.features), examples.labels))
                .shuffle(10_000, seed=shuffle_seed, reshuffle_each_iteration=False)
                .repeat().batch(BATCH).take(K_STEPS))
    got = list(rounds.dataset("b", 4).as_numpy_iterator())
    want = list(pipeline.as_numpy_iterator())
    assert len(got) == len(want) == K_STEPS
    for (x, y), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(y, wy)
        for key in wx:
            np.testing.assert_array_equal(x[key], wx[key])


def test_text_rounds_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="needs client_ids"):
        prefix_cache.TextRounds(lambda cid: None, prefix_cache.RoundDraw(K_STEPS, BATCH, seed=0))
    with pytest.raises(ValueError, match="need a 'padding_mask'"):
        prefix_cache.ClientExamples({"token_ids": np.ones((2, 3), np.int32)}, np.zeros(2))


@pytest.mark.parametrize("fixed_shape", [True, False])
def test_client_examples_from_dataset_reads_every_element_in_order(monkeypatch, fixed_shape):
    # Chunks of 7 over 20 elements: two full chunks and a ragged one. A variable-shape dataset
    # takes the one-element-at-a-time path; both must give the arrays stacked in order.
    monkeypatch.setattr(prefix_cache, "_READ_CHUNK", 7)
    rng = np.random.default_rng(3)
    n, length = 20, 5
    tokens = rng.integers(1, VOCAB, (n, length)).astype(np.int32)
    mask = (np.arange(length)[None, :] < rng.integers(1, length + 1, n)[:, None]).astype(np.int32)
    labels = rng.integers(0, 2, n).astype(np.int32)
    elements = [(collections.OrderedDict(padding_mask=mask[i], token_ids=tokens[i]), labels[i])
                for i in range(n)]
    shape = [length] if fixed_shape else [None]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(elements),
        output_signature=(collections.OrderedDict(
            padding_mask=tf.TensorSpec(shape, tf.int32),
            token_ids=tf.TensorSpec(shape, tf.int32)), tf.TensorSpec([], tf.int32)))
    examples = prefix_cache.ClientExamples.from_dataset(dataset)
    np.testing.assert_array_equal(examples.features["token_ids"], tokens)
    np.testing.assert_array_equal(examples.features["padding_mask"], mask)
    np.testing.assert_array_equal(examples.labels, labels)
    np.testing.assert_array_equal(examples.lengths, mask.sum(axis=1))
    with pytest.raises(ValueError, match="a client has no examples"):
        prefix_cache.ClientExamples.from_dataset(dataset.take(0))


def _at_once(calls):
    """Runs the zero-argument `calls` on threads released together; returns their results."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(slot):
        barrier.wait()
        results[slot] = calls[slot]()

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    return results


def test_prefix_cache_computes_each_example_once_when_two_threads_ask_at_once():
    # run_rounds(prefetch=True) builds round t+1's batches on a thread while evaluation reads
    # h_k on the main one. The slow prefix below holds the first thread inside the computation
    # long enough that, without the cache's lock, the second would also find every example
    # missing and compute it again (`computed` would be 2n) or read a half-filled store.
    examples = _clients()["1"]
    n = len(examples)
    batch_sizes = []

    def slow_prefix(features):  # h_k = (token, -token) per position: checkable per example
        batch_sizes.append(len(features["token_ids"]))
        time.sleep(0.2)
        return features["token_ids"][..., None].astype(np.float32) * np.float32([1, -1])

    cache = prefix_cache.PrefixCache(prefix=None, compute_batch_size=4)
    cache._compute = slow_prefix
    forward, backward = np.arange(n), np.arange(n)[::-1]
    got = _at_once([lambda: cache.hidden("train/1", examples, forward),
                    lambda: cache.hidden("train/1", examples, backward)])
    assert cache.computed == n and sum(batch_sizes) == n and cache.examples_cached == n
    tokens = examples.features["token_ids"]
    for order, states in zip((forward, backward), got):
        for i, h in zip(order, states):
            expected = tokens[i, :examples.lengths[i], None] * np.float32([1, -1])
            np.testing.assert_array_equal(h, expected)


def test_text_rounds_loads_a_client_once_when_two_threads_ask_at_once():
    clients, loads = _clients(), []

    def slow_load(cid):
        loads.append(cid)
        time.sleep(0.2)  # without the lock the second thread would load the client again
        return clients[cid]

    rounds = prefix_cache.TextRounds(slow_load, prefix_cache.RoundDraw(K_STEPS, BATCH, seed=0),
                                     client_ids=["0", "2"])
    first, second = _at_once([lambda: rounds.examples("2"), lambda: rounds.examples("2")])
    assert loads == ["2"] and first is second is clients["2"]


def test_a_float16_cache_keeps_half_the_bytes_and_batches_its_values_widened():
    """dtype="float16": each h_k is kept as the float16 rounding of the prefix's float32 output
    (half the bytes), and `batch` gives exactly those values back as float32."""
    examples = _clients()["1"]
    ids = np.arange(len(examples))

    def prefix(features):   # h_k = (token / 3, -token): float16 rounds token / 3
        return features["token_ids"][..., None].astype(np.float32) * np.float32([1 / 3, -1])

    caches = {}
    for dtype in ("float32", "float16"):
        caches[dtype] = prefix_cache.PrefixCache(prefix=None, compute_batch_size=4, dtype=dtype)
        caches[dtype]._compute = prefix
    full, half = (caches[d].hidden("train/1", examples, ids) for d in ("float32", "float16"))
    assert sum(h.nbytes for h in half) * 2 == sum(h.nbytes for h in full)
    for h32, h16 in zip(full, half, strict=True):
        assert h16.dtype == np.float16
        np.testing.assert_array_equal(h16, h32.astype(np.float16))
    (x, labels), (x32, _) = (caches[d].batch("train/1", examples, ids) for d in ("float16",
                                                                                  "float32"))
    assert x["hidden"].dtype == np.float32
    np.testing.assert_array_equal(x["hidden"], x32["hidden"].astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(x["padding_mask"], x32["padding_mask"])
    np.testing.assert_array_equal(labels, examples.labels)
    assert 0 < np.abs(x["hidden"] - x32["hidden"]).max() <= np.abs(x32["hidden"]).max() / 1024
    with pytest.raises(ValueError, match="prefix cache dtype 'bfloat16': choose from float32, "
                                         "float16"):
        prefix_cache.PrefixCache(prefix=None, dtype="bfloat16")


def test_a_width_multiple_pads_token_and_cached_batches_and_keeps_the_losses():
    """`RoundDraw.width_multiple` m: every batch, of tokens or of cached h_k, is the m = 1 batch
    with zero columns up to ⌈w/m⌉·m (at most the stored SEQ), and the classifier's
    per-example losses on the token batches are the m = 1 ones."""
    model = _full_model()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    clients = _clients()
    cache = prefix_cache.PrefixCache(prefix=None, compute_batch_size=4)
    cache._compute = lambda f: f["token_ids"][..., None].astype(np.float32) * np.float32([1, -2])
    for with_cache in (False, True):
        exact, rounded = (prefix_cache.TextRounds(clients, prefix_cache.RoundDraw(
            K_STEPS, BATCH, seed=3, width_multiple=m), cache=cache if with_cache else None)
            for m in (1, 5))
        widths = set()
        for cid in clients:
            for (x, y), (x5, y5) in zip(exact.batches(cid, 2), rounded.batches(cid, 2),
                                        strict=True):
                w, w5 = x["padding_mask"].shape[1], x5["padding_mask"].shape[1]
                assert w5 == min(-(-w // 5) * 5, SEQ), (w, w5)
                widths.add(w5)
                np.testing.assert_array_equal(y5, y)
                for key in x:
                    np.testing.assert_array_equal(x5[key][:, :w], x[key], err_msg=key)
                    assert not x5[key][:, w:].any(), key
                if not with_cache:
                    np.testing.assert_allclose(loss(y5, model(dict(x5))), loss(y, model(dict(x))),
                                               atol=1e-5)
        assert widths <= {5, 10, SEQ} and len(widths) > 1
