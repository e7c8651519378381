"""models/lm_evaluation.py: batched greedy generation and likelihood scoring, against an
independent loop over one prompt at a time (every position's logits, numpy argmax and
log-softmax), on tiny random GPT-2 (absolute positions, with the key/value cache) and Llama
(rotary, uncached) decoders, with prompts of different lengths in one batch; and the cache
itself (GPT-2 and Gemma 3, LoRA active, Gemma's window shorter than the sequences) against
`causal_lm.greedy_generate` and the uncached backbone's logits."""

import dataclasses

import keras_nlp
import numpy as np
import pytest
import tensorflow as tf
from keras_nlp.src.models.llama.llama_backbone import LlamaBackbone

from models import causal_lm, gguf_checkpoint, lm_evaluation, lora_targets
from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig
from models.lora_targets import LoraConfig, apply_lora
from tests.models.gemma3_reference import random_gguf_tensors

pytestmark = pytest.mark.filterwarnings("ignore:The initializer RandomNormal is unseeded")

VOCAB = 30
PROMPTS = [[3, 4, 5], [9], [2, 8, 6, 7, 11, 12], [5, 5]]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def backbone(request):
    tf.keras.utils.set_random_seed(0)
    if request.param == "gpt2":
        return keras_nlp.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, dropout=0.0,
                                             max_sequence_length=32)
    return LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                         num_key_value_heads=1, hidden_dim=8, intermediate_dim=16)


def _log_probs(backbone, ids):
    """(len(ids), V) float64 log-softmax of every position's logits, the sequence alone."""
    ids = np.asarray([ids], np.int32)
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    logits = backbone.token_embedding(hidden, reverse=True).numpy()[0].astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _greedy(backbone, prompt, steps, stops=()):
    ids = list(prompt)
    for _ in range(steps):
        token = int(np.argmax(_log_probs(backbone, ids)[-1]))
        if token in stops:
            break
        ids.append(token)
    return ids[len(prompt):]


def test_batched_generation_equals_each_prompt_alone(backbone):
    expected = [_greedy(backbone, p, 4) for p in PROMPTS]
    assert lm_evaluation.generate(backbone, PROMPTS, 4, batch_size=3) == expected
    # A stop token ends its row only (before its first occurrence): every other row goes on.
    stop = expected[0][1]
    with_stop = [_greedy(backbone, p, 4, stops={stop}) for p in PROMPTS]
    assert lm_evaluation.generate(backbone, PROMPTS, 4, stop_ids=[stop]) == with_stop
    assert with_stop[0] == expected[0][:expected[0].index(stop)]


def test_batched_log_likelihoods_and_choice_equal_numpy(backbone):
    candidates = [[6], [7, 8], [9, 10, 11]]
    expected = np.zeros((len(PROMPTS), len(candidates)))
    for i, prompt in enumerate(PROMPTS):
        for k, continuation in enumerate(candidates):
            log_probs = _log_probs(backbone, prompt + continuation)
            expected[i, k] = sum(log_probs[len(prompt) + j - 1, token]
                                 for j, token in enumerate(continuation))
    pairs = [(p, c) for p in PROMPTS for c in candidates]
    got = lm_evaluation.log_likelihoods(backbone, [p for p, _ in pairs], [c for _, c in pairs],
                                        batch_size=5)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lm_evaluation.choose(backbone, PROMPTS, candidates),
                                  expected.argmax(1))


def test_empty_prompts_and_continuations_are_refused(backbone):
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        lm_evaluation.generate(backbone, [[1], []], 2)
    with pytest.raises(ValueError, match="continuation needs at least one token"):
        lm_evaluation.log_likelihoods(backbone, [[1]], [[]])


def test_bad_arguments_are_refused_in_one_line(backbone):
    assert lm_evaluation.generate(backbone, PROMPTS, 0) == [[]] * len(PROMPTS)
    with pytest.raises(ValueError, match="need max_new_tokens ≥ 0 and batch_size ≥ 1"):
        lm_evaluation.generate(backbone, PROMPTS, -1)
    with pytest.raises(ValueError, match="need max_new_tokens ≥ 0 and batch_size ≥ 1"):
        lm_evaluation.generate(backbone, PROMPTS, 2, batch_size=0)
    if isinstance(backbone, LlamaBackbone):
        assert not lm_evaluation.has_cache(backbone)
        with pytest.raises(ValueError, match="LlamaBackbone has no key/value cache"):
            lm_evaluation.cached_next_token_logits(backbone, [[1]], [[2]])
    else:   # GPT-2's 32 positions: a 6-token prompt and 27 new tokens need 6 + 26 = 32
        assert len(lm_evaluation.generate(backbone, PROMPTS, 27)[2]) == 27
        with pytest.raises(ValueError, match="reach 33 positions; .* max_sequence_length=32"):
            lm_evaluation.generate(backbone, PROMPTS, 28)


# ---- The key/value cache: GPT-2 and Gemma 3, LoRA active -------------------------------------

CACHE_PROMPTS = [[3, 4, 5], [9], [2, 8, 6, 7, 11, 12], [5, 5], [13, 1, 7, 7, 2]]
NEW_TOKENS = 8
# A tiny Gemma 3: two local layers (window 3, shorter than every prompt + continuation here)
# and a global one.
GEMMA = {"vocabulary_size": 64, "num_layers": 3, "num_query_heads": 2, "num_key_value_heads": 1,
         "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8, "sliding_window": 3,
         "global_layer_every": 3, "layer_norm_epsilon": 1e-6}
# |cached − uncached logits| (float32); measured at most 4.5e-8 (GPT-2, |logits| ≤ 0.12)
# and 5.2e-6 (Gemma 3, |logits| ≤ 4.9).
CACHE_TOLERANCE = 1e-5


def _full_logits(backbone, ids):
    """(len(ids), V) float64: every position's logits, the uncached backbone on `ids` alone."""
    ids = np.asarray([ids], np.int32)
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return backbone.token_embedding(hidden, reverse=True).numpy()[0].astype(np.float64)


def _with_random_lora(backbone, targets, seed):
    """LoRA (rank 2) on `targets` of every layer, B random (at B = 0 the adapters do nothing)."""
    adapters = apply_lora(backbone, LoraConfig(rank=2, targets=tuple(targets)))
    rng = np.random.default_rng(seed)
    for adapter in adapters.values():
        adapter.lora_b.assign(rng.normal(0, 0.5, adapter.lora_b.shape).astype(np.float32))
    return backbone


def _gemma3(sliding_window):
    """The tiny Gemma 3 with random weights, its post-block norms ×3 (at ~1 the token's own
    embedding dominates the tied output projection and greedy decoding repeats one token)."""
    backbone = Gemma3Backbone(Gemma3BackboneConfig(**{**GEMMA,
                                                      "sliding_window": sliding_window}))
    tensors, _ = random_gguf_tensors(GEMMA, quantize=False, seed=3)
    for name in tensors:
        if name.endswith(("post_attention_norm", "post_ffw_norm")):
            tensors[name] = tensors[name] * 3
    gguf_checkpoint.assign_gguf_weights(backbone, tensors)
    return backbone


@dataclasses.dataclass
class Adapted:
    backbone: tf.keras.Model
    base_logits: np.ndarray           # `_full_logits(PROBE)` before the adapters
    wide_window_logits: np.ndarray | None = None   # Gemma: the same weights, window 100


PROBE = [2, 8, 6, 7, 11, 12, 3, 4, 5, 9]


@pytest.fixture(scope="module", params=["gpt2", "gemma3"])
def adapted(request):
    if request.param == "gpt2":
        tf.keras.utils.set_random_seed(0)
        backbone = keras_nlp.models.GPT2Backbone(
            vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
            intermediate_dim=32, dropout=0.0, max_sequence_length=32)
        base = _full_logits(backbone, PROBE)
        return Adapted(_with_random_lora(backbone, lora_targets.TARGETS, 0), base)
    backbone = _gemma3(GEMMA["sliding_window"])
    base = _full_logits(backbone, PROBE)
    _with_random_lora(backbone, lora_targets.ALL_TARGETS, 0)
    wide = _with_random_lora(_gemma3(100), lora_targets.ALL_TARGETS, 0)
    wide.set_weights(backbone.get_weights())
    return Adapted(backbone, base, _full_logits(wide, PROBE))


def test_the_adapters_and_the_window_change_the_logits(adapted):
    """What the cache tests below rest on: the adapters (B ≠ 0) change the logits, and so does
    Gemma's window, at the positions that reach back further than it."""
    logits = _full_logits(adapted.backbone, PROBE)
    assert np.abs(logits - adapted.base_logits).max() > 0.1
    if adapted.wide_window_logits is not None:
        window = GEMMA["sliding_window"]
        difference = np.abs(logits - adapted.wide_window_logits).max(axis=-1)
        assert (difference[:window] < 1e-5).all() and (difference[window:] > 1e-2).all()


def test_cached_generation_equals_greedy_generate_on_each_prompt_alone(adapted):
    backbone = adapted.backbone
    assert lm_evaluation.has_cache(backbone)
    expected = [causal_lm.greedy_generate(backbone, p, NEW_TOKENS) for p in CACHE_PROMPTS]
    # Varied tokens (random tiny models often repeat one): wrong math would show.
    assert all(len(set(tokens)) >= 2 for tokens in expected), expected
    assert len({t for tokens in expected for t in tokens}) >= 6, expected
    assert max(len(p) for p in CACHE_PROMPTS) + NEW_TOKENS > 2 * GEMMA["sliding_window"]
    # 4 rows, then 1: the second batch reuses the graphs with another batch size and width.
    got = lm_evaluation.generate(backbone, CACHE_PROMPTS, NEW_TOKENS, batch_size=4)
    assert got == expected
    # Without the cache (the whole buffer at every step): the same tokens.
    assert lm_evaluation.generate(backbone, CACHE_PROMPTS, NEW_TOKENS, use_cache=False) == expected
    # A stop token ends its row only, before its first occurrence: one that row 0 generates
    # after its first token and some other row never generates.
    stop = next(t for t in expected[0][1:] if t != expected[0][0]
                and any(t not in tokens for tokens in expected))
    with_stop = [causal_lm.greedy_generate(backbone, p, NEW_TOKENS, stop_ids=[stop])
                 for p in CACHE_PROMPTS]
    assert with_stop[0] == expected[0][:expected[0].index(stop)]
    assert any(len(tokens) == NEW_TOKENS for tokens in with_stop)
    assert lm_evaluation.generate(backbone, CACHE_PROMPTS, NEW_TOKENS, stop_ids=[stop],
                                  batch_size=4) == with_stop


def test_cached_logits_equal_the_full_buffer_logits(adapted):
    """Teacher-forced continuations of different lengths, one token per row and step: each
    step's logits are the uncached backbone's at the same position of the row alone."""
    backbone = adapted.backbone
    rng = np.random.default_rng(1)
    continuations = [rng.integers(1, VOCAB, size=k).tolist() for k in (6, 9, 3, 7, 5)]
    cached = lm_evaluation.cached_next_token_logits(backbone, CACHE_PROMPTS, continuations)
    worst = 0.0
    for prompt, continuation, got in zip(CACHE_PROMPTS, continuations, cached):
        expected = _full_logits(backbone, prompt + continuation)[len(prompt) - 1:]
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=CACHE_TOLERANCE)
        assert np.ptp(expected, axis=-1).min() > 0.1   # logits that tell tokens apart
        worst = max(worst, float(np.abs(got - expected).max()))
    print(f"\nmax |cached − full logits|: {worst:.2e}")
