"""The LoRA algorithms of `tffl.algorithms.lora_fl` on a decoder language model, unchanged: a
tiny random KerasNLP GPT-2 with LoRA, the response-only causal-LM loss
(`models.causal_lm.build_causal_lm`, `with_response_targets`), run by TFF's worker. RoLoRA's B
round and A round are checked against SGD written here with a GradientTape on
`models.causal_lm.response_loss` over the backbone itself."""

import collections

import keras_nlp
import numpy as np
import pytest
import tensorflow as tf

from models import causal_lm
from models.lora_targets import LoraConfig, apply_lora
from tests.tffl.algorithms import eager_reference
from tffl import runtime
from tffl.algorithms import lora_fl
from tffl.engine import roles

# GPT-2 initializes its weights with std 0.02, so gradients are small: a large step makes every
# factor move well above float32 round-off in one pass.
LENGTH, VOCAB, LR = 8, 30, 100.0
SPEC = (collections.OrderedDict(
    padding_mask=tf.TensorSpec([None, LENGTH], tf.int32),
    response_mask=tf.TensorSpec([None, LENGTH], tf.int32),
    token_ids=tf.TensorSpec([None, LENGTH], tf.int32)), tf.TensorSpec([None], tf.int32))


def _gpt2_lora():
    """(backbone, causal LM): seeded, so every build (TFF's and the reference's) is the same."""
    tf.keras.utils.set_random_seed(0)
    backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, dropout=0.0,
                                             max_sequence_length=LENGTH)
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    return backbone, causal_lm.build_causal_lm(backbone)


def _client_data(seed, n=6):
    """n sequences: a prompt of 3 to 5 tokens, a response of 1 to 3, right padding."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n, LENGTH), np.int32)
    padding, response = np.zeros_like(tokens), np.zeros_like(tokens)
    for i in range(n):
        prompt, answer = rng.integers(3, 6), rng.integers(1, 4)
        tokens[i, :prompt + answer] = rng.integers(1, VOCAB, prompt + answer)
        padding[i, :prompt + answer] = 1
        response[i, prompt:prompt + answer] = 1
    x = collections.OrderedDict(padding_mask=padding, response_mask=response, token_ids=tokens)
    return tf.data.Dataset.from_tensor_slices(x).batch(3).map(causal_lm.with_response_targets)


def _reference_round(weights, role, datasets):
    """Every client loads `weights` and takes one SGD pass over its batches on the factors of
    `role`, on `response_loss`; the clients' values averaged with weights n_i, their numbers of
    response tokens (a batch's examples, for the engine, are its targets)."""
    backbone, model = _gpt2_lora()
    finals, counts = [], []
    for dataset in datasets:
        for variable, value in zip(model.trainable_variables, weights.trainable):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, weights.non_trainable):
            variable.assign(value)
        trained = [v for v in model.trainable_variables if roles.role_of(v) == role]
        counts.append(sum(int(tf.size(y)) for _, y in dataset))
        for x, _ in dataset:
            with tf.GradientTape() as tape:
                loss = causal_lm.response_loss(backbone, x, training=True)
            for variable, grad in zip(trained, tape.gradient(loss, trained)):
                variable.assign_sub(LR * grad)
        finals.append([v.numpy() for v in model.trainable_variables])
    p = np.asarray(counts, np.float64) / sum(counts)
    return [sum(p_i * f[k] for p_i, f in zip(p, finals)) for k in range(len(finals[0]))]


def test_rolora_b_and_a_rounds_on_a_gpt2_decoder_equal_sgd_on_the_response_loss():
    process = lora_fl.build_rolora(lambda: _gpt2_lora()[1], SPEC, LR)
    a_idx, b_idx = process.spec.indices([roles.LORA_A]), process.spec.indices([roles.LORA_B])
    assert len(a_idx) == len(b_idx) == 2
    datasets = [_client_data(1), _client_data(2)]
    # B ≠ 0 from the start, so that the A round's steps are not float32 round-off.
    start, mid, end = eager_reference.rolora_two_rounds(process, datasets, b_idx, 0.5)
    for got, before, role, moved in ((mid, start, roles.LORA_B, b_idx),
                                     (end, mid, roles.LORA_A, a_idx)):
        expected = _reference_round(before, role, datasets)
        for k in range(len(got.trainable)):
            step = np.asarray(expected[k]) - before.trainable[k]
            if k in moved:
                assert np.abs(step).max() > 1e-4
                np.testing.assert_allclose(got.trainable[k] - before.trainable[k], step,
                                           atol=1e-3 * np.abs(step).max())
            else:
                np.testing.assert_array_equal(got.trainable[k], before.trainable[k])
        for x, y in zip(got.non_trainable, before.non_trainable):
            np.testing.assert_array_equal(x, y)   # the backbone never moves


@pytest.mark.large
@pytest.mark.parametrize("name", ["fedavg_lora", "ffa_lora", "flexlora", "flora"])
def test_every_lora_algorithm_trains_the_decoder(name):
    process = lora_fl.build_lora_process(name, lambda: _gpt2_lora()[1], SPEC, LR)
    datasets = [_client_data(1), _client_data(2)]
    with runtime.local_runtime():
        state = process.initialize()
        start = process.model_weights(state)
        output = process.next_round(state, datasets)
        end = process.model_weights(output.state)
    loss = output.metrics["client_work"]["train"]["loss"]
    assert np.isfinite(loss) and loss > 0
    moved = [np.abs(np.asarray(a) - b).max() for a, b in zip(end.trainable, start.trainable)]
    assert max(moved) > 1e-4
    merged = [np.abs(np.asarray(a) - b).max() for a, b in zip(end.non_trainable,
                                                               start.non_trainable)]
    # FLoRA merges scale·Σ p_i·A_i·B_i into the frozen query and value kernels; the others
    # never move the backbone.
    assert (max(merged) > 0) == (name == "flora")


TINY_GEMMA = {"vocabulary_size": VOCAB, "num_layers": 2, "num_query_heads": 2,
              "num_key_value_heads": 1, "hidden_dim": 8, "intermediate_dim": 16, "head_dim": 4,
              "sliding_window": 4, "global_layer_every": 2}


def _gemma_lora(base_dtype):
    """A tiny Gemma 3 causal LM with LoRA on query and value, its base stored at `base_dtype`."""
    from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig

    tf.keras.utils.set_random_seed(0)
    backbone = Gemma3Backbone(Gemma3BackboneConfig(**TINY_GEMMA), base_dtype=base_dtype)
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    return causal_lm.build_causal_lm(backbone)


def _two_rolora_rounds(values_by_dtype):
    """`(runs, frozen)`: per base dtype, RoLoRA's two rounds (`eager_reference`) of the tiny
    Gemma with that base starting at its values, and its process's frozen-weights file."""
    runs, frozen = {}, {}
    for base_dtype, values in values_by_dtype.items():
        process = lora_fl.build_rolora(lambda d=base_dtype: _gemma_lora(d), SPEC, LR,
                                       initial_non_trainable=values)
        b_idx = process.spec.indices([roles.LORA_B])
        runs[base_dtype] = eager_reference.rolora_two_rounds(
            process, [_client_data(1), _client_data(2)], b_idx, 0.5)
        frozen[base_dtype] = process.model.frozen
    return runs, frozen


def _assert_same_trained_weights(runs, base_dtype):
    """The `base_dtype` run's trained weights equal the float32 run's after every round, and
    the rounds moved them."""
    for low_weights, wide_weights in zip(runs[base_dtype], runs["float32"]):
        for got, expected in zip(low_weights.trainable, wide_weights.trainable):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    moved = np.abs(np.asarray(runs["float32"][2].trainable[0]) - runs["float32"][0].trainable[0])
    assert moved.max() > 1e-4                         # the rounds did train


def test_a_bfloat16_base_trains_as_a_float32_one_holding_its_rounded_weights():
    """RoLoRA's B and A rounds with the frozen base stored in bfloat16 (`models.base_precision`)
    equal the same rounds of a float32 model whose base holds bf16(W) widened: the step reads
    each weight widened and computes in float32. The base file holds half the bytes."""
    rng = np.random.default_rng(0)
    low = _gemma_lora("bfloat16")
    stored = []   # a "pretrained" base: norms near 1, kernels N(0, 0.3²), rounded to its dtype
    for variable in low.non_trainable_variables:
        scale = "scale" in variable.name
        value = (1.0 if scale else 0.0) + rng.normal(0.0, 0.1 if scale else 0.3, variable.shape)
        stored.append(value.astype(variable.dtype.as_numpy_dtype))
    dtypes = {v.dtype.name for v in low.non_trainable_variables}
    assert dtypes == {"bfloat16", "float32"}          # kernels and embedding; the norms
    assert {v.dtype.name for v in low.trainable_variables} == {"float32"}   # LoRA's factors
    widened = [v.astype(np.float32) for v in stored]
    runs, frozen = _two_rolora_rounds({"bfloat16": stored, "float32": widened})
    _assert_same_trained_weights(runs, "bfloat16")
    size = {d: sum(np.prod(s) * np.dtype(t).itemsize for s, t in zip(f.shapes, f.dtypes))
            for d, f in frozen.items()}
    norms = sum(v.size * 4 for v in stored if v.dtype == np.float32)
    assert size["bfloat16"] - norms == (size["float32"] - norms) // 2


@pytest.mark.large   # two more processes (40 s); tests/models/test_base_precision.py is fast
def test_an_int8_base_trains_as_a_float32_one_holding_its_widened_weights():
    """RoLoRA's B and A rounds with the frozen base stored as int8 with float32 scales (one per
    output channel here: the tiny widths are not multiples of 32; `models.base_precision`)
    equal the same rounds of a float32 model whose base holds q·s, computed here in numpy: the
    step reads each kernel widened (the embedding's lookup and its tied output projection
    included) and computes in float32."""
    rng = np.random.default_rng(0)
    low = _gemma_lora("int8")
    stored, widened = [], []   # q uniform in [−127, 127], scales around 0.3/127; norms near 1
    variables = list(low.non_trainable_variables)
    for k, variable in enumerate(variables):
        if variable.dtype == tf.int8:
            stored.append(rng.integers(-127, 128, variable.shape).astype(np.int8))
        elif k and variables[k - 1].dtype == tf.int8:      # the scale beside its q
            scale = rng.uniform(0.5, 1.5, variable.shape).astype(np.float32) * 0.3 / 127
            stored.append(scale)
            widened.append(stored[-2].astype(np.float32) * scale)
        else:
            stored.append((1.0 + rng.normal(0.0, 0.1, variable.shape)).astype(np.float32))
            widened.append(stored[-1])
    assert sum(v.dtype == tf.int8 for v in variables) == 1 + 7 * TINY_GEMMA["num_layers"]
    assert {v.dtype.name for v in low.trainable_variables} == {"float32"}   # LoRA's factors
    runs, _ = _two_rolora_rounds({"int8": stored, "float32": widened})
    _assert_same_trained_weights(runs, "int8")
