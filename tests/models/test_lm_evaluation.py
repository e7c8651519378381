"""models/lm_evaluation.py: batched greedy generation and likelihood scoring, against an
independent loop over one prompt at a time (every position's logits, numpy argmax and
log-softmax), on tiny random GPT-2 (absolute positions) and Llama (rotary) decoders, with
prompts of different lengths in one batch."""

import keras_nlp
import numpy as np
import pytest
from keras_nlp.src.models.llama.llama_backbone import LlamaBackbone

from models import lm_evaluation

pytestmark = pytest.mark.filterwarnings("ignore:The initializer RandomNormal is unseeded")

VOCAB = 30
PROMPTS = [[3, 4, 5], [9], [2, 8, 6, 7, 11, 12], [5, 5]]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def backbone(request):
    import tensorflow as tf

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
