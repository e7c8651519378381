"""models/causal_lm.py: the next-token loss on response tokens only, against a
numpy cross-entropy over every position's logits, on tiny random GPT-2 (tied output embedding)
and Llama (untied) decoders."""

import keras_nlp
import numpy as np
import pytest
import tensorflow as tf
# KerasNLP 0.8 ships Llama's backbone without exporting it from keras_nlp.models.
from keras_nlp.src.models.llama.llama_backbone import LlamaBackbone

from models import causal_lm

# Llama's and Mistral's KerasNLP initializers warn that they are unseeded (their own code).
pytestmark = pytest.mark.filterwarnings("ignore:The initializer RandomNormal is unseeded")

VOCAB = 30


def _gpt2():
    return keras_nlp.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2,
                                         hidden_dim=8, intermediate_dim=16, dropout=0.0,
                                         max_sequence_length=16)


def _llama():
    return LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                         num_key_value_heads=1, hidden_dim=8,
                         intermediate_dim=16)


# Three sequences of 8: prompt, response, right padding (the last has no response at all).
TOKENS = np.array([[3, 4, 5, 6, 7, 8, 0, 0],
                   [9, 10, 11, 12, 13, 14, 15, 16],
                   [2, 3, 4, 0, 0, 0, 0, 0]], np.int32)
PADDING = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]], np.int32)
RESPONSE = np.array([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1], [0] * 8], np.int32)


def _batch(tokens=TOKENS, response=RESPONSE):
    return {"token_ids": tokens, "padding_mask": PADDING, "response_mask": response}


def _numpy_loss(backbone, batch):
    """Every position's logits from the backbone, then log-softmax and the response targets in
    numpy, position by position."""
    hidden = backbone({"token_ids": batch["token_ids"], "padding_mask": batch["padding_mask"]})
    logits = backbone.token_embedding(hidden, reverse=True).numpy().astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    losses = [-log_probs[b, t - 1, batch["token_ids"][b, t]]
              for b in range(len(batch["token_ids"])) for t in range(1, TOKENS.shape[1])
              if batch["response_mask"][b, t]]
    return np.mean(losses), len(losses)


@pytest.fixture(params=["gpt2", "llama"])
def backbone(request):
    tf.keras.utils.set_random_seed(0)
    return {"gpt2": _gpt2, "llama": _llama}[request.param]()


def test_loss_is_the_numpy_cross_entropy_of_the_response_tokens(backbone):
    expected, count = _numpy_loss(backbone, _batch())
    assert count == 6
    logits, targets = causal_lm.response_logits(backbone, _batch())
    assert logits.shape == (6, VOCAB)   # response positions only, not 3 x 8 x VOCAB
    np.testing.assert_array_equal(targets.numpy(), [6, 7, 8, 14, 15, 16])
    np.testing.assert_allclose(float(causal_lm.response_loss(backbone, _batch())), expected,
                               rtol=1e-5)


def test_padding_tokens_do_not_change_the_loss(backbone):
    loss = float(causal_lm.response_loss(backbone, _batch()))
    other = TOKENS.copy()
    other[PADDING == 0] = 17
    assert float(causal_lm.response_loss(backbone, _batch(tokens=other))) == loss


def test_prompt_tokens_are_not_targets(backbone):
    # Marking the first prompt token a "response" adds nothing: no position predicts token 0.
    response = RESPONSE.copy()
    response[:, 0] = 1
    assert causal_lm.response_indices(response).shape[0] == 6
    # A batch of prompts only: loss 0, not NaN.
    assert float(causal_lm.response_loss(backbone, _batch(response=np.zeros_like(RESPONSE)))) == 0


def _all_logits(backbone, ids):
    ids = np.asarray([ids], np.int32)
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return backbone.token_embedding(hidden, reverse=True).numpy()[0].astype(np.float64)


def test_greedy_generation_takes_the_argmax_and_stops_before_a_stop_token(backbone):
    prompt = [3, 4, 5]
    expected = list(prompt)
    for _ in range(4):   # an independent greedy loop over every position's logits
        expected.append(int(np.argmax(_all_logits(backbone, expected)[-1])))
    generated = causal_lm.greedy_generate(backbone, prompt, max_new_tokens=4)
    assert generated == expected[3:]
    stop = expected[4]
    if stop != expected[3]:
        assert causal_lm.greedy_generate(backbone, prompt, 4, stop_ids=[stop]) == expected[3:4]
    assert causal_lm.greedy_generate(backbone, prompt, 4, stop_ids=[expected[3]]) == []


def test_likelihood_of_a_continuation_and_the_choice_between_candidates(backbone):
    prompt, candidates = [3, 4, 5], [[6], [7, 8], [9, 10, 11]]
    scores = []
    for continuation in candidates:
        logits = _all_logits(backbone, prompt + continuation)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        scores.append(sum(log_probs[len(prompt) + j - 1, token]
                          for j, token in enumerate(continuation)))
        np.testing.assert_allclose(
            causal_lm.continuation_log_likelihood(backbone, prompt, continuation), scores[-1],
            rtol=1e-5)
    assert causal_lm.choose_by_likelihood(backbone, prompt, candidates) == int(np.argmax(scores))


def test_rolora_b_then_a_phases_of_the_engine_loop_equal_eager_sgd_on_the_response_loss():
    """`build_causal_lm` + `with_response_targets` in tffl's client loop (a B phase, then an A phase,
    as RoLoRA's two round kinds train them) against SGD written here with a GradientTape on
    `response_loss` over the backbone itself."""
    import tensorflow_federated as tff

    from models.lora_targets import LoraConfig, apply_lora
    from tffl.engine import roles
    from tffl.engine.client_training import Phase, build_phased_loop

    tf.keras.utils.set_random_seed(0)
    backbone = _gpt2()
    adapters = apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    rng = np.random.default_rng(1)
    for adapter in adapters.values():
        adapter.lora_b.assign(rng.normal(0, 0.3, adapter.lora_b.shape).astype(np.float32))
    model = causal_lm.build_causal_lm(backbone)
    both = {k: np.concatenate([v, v[::-1]]) for k, v in _batch().items()}
    dataset = tf.data.Dataset.from_tensor_slices(both).batch(3).map(
        causal_lm.with_response_targets)
    batches = [{k: v.numpy() for k, v in x.items()} for x, _ in dataset]
    assert np.array_equal(batches[1]["token_ids"], TOKENS[::-1])
    trainable = model.trainable_variables
    b_idx = tuple(i for i, v in enumerate(trainable) if roles.role_of(v) == roles.LORA_B)
    a_idx = tuple(i for i, v in enumerate(trainable) if roles.role_of(v) == roles.LORA_A)
    assert len(trainable) == len(b_idx) + len(a_idx) == 8
    start = [v.numpy() for v in trainable]
    frozen = [v.numpy() for v in model.non_trainable_variables]

    def loss_fn(y, logits):
        return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True))

    loop = build_phased_loop(model, loss_fn, 0.5, [Phase(b_idx), Phase(a_idx)])
    out = loop(tff.learning.models.ModelWeights(trainable=start, non_trainable=frozen), dataset)

    for variable, value in zip(trainable, start):
        variable.assign(value)
    loss_sum = correct = count = 0.0
    for indices in (b_idx, a_idx):
        trained = [trainable[i] for i in indices]
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = causal_lm.response_loss(backbone, batch, training=True)
            if indices is a_idx:   # the last phase's tallies, before each step
                logits, targets = causal_lm.response_logits(backbone, batch)
                loss_sum += float(loss) * len(targets)
                correct += float(np.sum(np.argmax(logits, -1) == targets.numpy()))
                count += len(targets)
            for variable, grad in zip(trained, tape.gradient(loss, trained)):
                variable.assign_sub(0.5 * grad)
    for got, variable in zip(out["trainable"], trainable):
        np.testing.assert_allclose(got.numpy(), variable.numpy(), rtol=1e-5, atol=1e-6)
    assert any(np.abs(v.numpy() - s).max() > 1e-3 for v, s in zip(trainable, start))
    assert float(out["num_examples"]) == count == 12
    np.testing.assert_allclose(float(out["loss_sum"]), loss_sum, rtol=1e-5)
    assert float(out["num_correct"]) == correct


def test_the_cached_prefix_and_the_suffix_give_the_whole_models_loss(backbone):
    from models.lora_targets import LoraConfig, apply_lora

    adapters = apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value"), layers=(1,)))
    rng = np.random.default_rng(2)
    for adapter in adapters.values():
        adapter.lora_b.assign(rng.normal(0, 0.5, adapter.lora_b.shape).astype(np.float32))
    prefix = causal_lm.build_prefix(backbone, 1)
    suffix = causal_lm.build_suffix_lm(backbone, 1)
    cached = prefix({"token_ids": TOKENS, "padding_mask": PADDING})
    logits = suffix({**cached, "response_mask": RESPONSE})
    whole, targets = causal_lm.response_logits(backbone, _batch())
    np.testing.assert_allclose(logits.numpy(), whole.numpy(), rtol=1e-5, atol=1e-5)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        targets, logits, from_logits=True))
    np.testing.assert_allclose(float(loss), float(causal_lm.response_loss(backbone, _batch())),
                               rtol=1e-5)
    # The suffix trains exactly the whole model's factors (those of layer 1).
    assert {id(v) for v in suffix.trainable_variables} == {
        id(v) for a in adapters.values() for v in (a.lora_a, a.lora_b)}
    with pytest.raises(ValueError, match="start_layer=2: the backbone has decoder layers 0..1"):
        causal_lm.build_prefix(backbone, 2)


def test_a_prefix_with_dropout_is_refused():
    with pytest.raises(ValueError, match="dropout 0.1: their output is not fixed"):
        causal_lm.build_prefix(keras_nlp.models.GPT2Backbone(
            vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
            dropout=0.1, max_sequence_length=16), 1)


def test_the_response_layer_says_how_to_rebuild_instead_of_serializing(backbone):
    model = causal_lm.build_causal_lm(backbone)
    with pytest.raises(NotImplementedError, match="rebuild the model with models.causal_lm"):
        model.get_layer("response_logits").get_config()


def _stored_table(dtype: str, rng):
    """(table, scale, E): a (10, 3) table stored at `dtype`, its scale (int8) and the float32
    E it stands for, written here (int8: E = q·s, one scale per row)."""
    if dtype == "bfloat16":
        table = tf.cast(rng.normal(size=(10, 3)), tf.bfloat16)
        return table, None, tf.cast(table, tf.float32).numpy()
    q = rng.integers(-127, 128, size=(10, 3)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, size=(10, 1)).astype(np.float32)
    return tf.constant(q), tf.constant(s), q.astype(np.float32) * s


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_widened_product_in_a_graph_has_the_gradient_of_the_widened_table(dtype):
    """In a graph, d/dh Σ sin(h·Eᵀ) = cos(h·Eᵀ)·E (numpy), by a tape and by `tf.gradients`
    (the registered gradient), and the logits are h·Eᵀ: blocks of 4, 4 and 2 rows."""
    rng = np.random.default_rng(0)
    table, scale, wide = _stored_table(dtype, rng)
    hidden = rng.normal(size=(2, 3)).astype(np.float32)

    @tf.function
    def measured(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            logits = causal_lm.widened_product(h, table, rows=4, scale=scale)
            loss = tf.reduce_sum(tf.sin(logits))
        return logits, tape.gradient(loss, h), tf.gradients(loss, h)[0]

    logits, by_tape, by_gradients = measured(tf.constant(hidden))
    expected = np.cos(hidden @ wide.T) @ wide
    np.testing.assert_allclose(logits, hidden @ wide.T, atol=1e-5)
    np.testing.assert_allclose(by_tape, expected, atol=1e-5)
    np.testing.assert_allclose(by_gradients, expected, atol=1e-5)


def test_a_graph_that_traced_widened_product_is_freed():
    """A graph holding the product and its gradient is collected once nothing refers to it
    (`tf.custom_gradient` registered a gradient per graph that kept it, and with it a TFF
    computation's whole traced model, for the rest of the process)."""
    import gc
    import weakref

    table, scale, _ = _stored_table("int8", np.random.default_rng(1))
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [2, 3])
        loss = tf.reduce_sum(causal_lm.widened_product(h, tf.constant(table.numpy()), rows=4,
                                                       scale=tf.constant(scale.numpy())))
        tf.gradients(loss, h)
    alive = weakref.ref(graph)
    del graph, h, loss
    gc.collect()
    assert alive() is None
