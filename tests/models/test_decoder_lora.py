"""LoRA on KerasNLP 0.8's decoder backbones: GPT-2, Llama and Mistral, tiny and
random. The logits are the tied (GPT-2) or untied output embedding of the last hidden state, as
their causal LMs compute them."""

import keras_nlp
import numpy as np
import pytest
import tensorflow as tf
# KerasNLP 0.8 ships Llama's backbone without exporting it from keras_nlp.models.
from keras_nlp.src.models.llama.llama_backbone import LlamaBackbone

from models import lora_targets
from models.lora_targets import LoraConfig, apply_lora

# Llama's and Mistral's KerasNLP initializers warn that they are unseeded (their own code).
pytestmark = pytest.mark.filterwarnings("ignore:The initializer RandomNormal is unseeded")

VOCAB, HIDDEN, INTERMEDIATE, LENGTH = 50, 8, 16, 7


def _gpt2():
    return keras_nlp.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2,
                                         hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE,
                                         dropout=0.0, max_sequence_length=16)


def _llama():
    return LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                         num_key_value_heads=1, hidden_dim=HIDDEN,
                         intermediate_dim=INTERMEDIATE)


def _mistral():
    return keras_nlp.models.MistralBackbone(vocabulary_size=VOCAB, num_layers=2,
                                            num_query_heads=2, num_key_value_heads=1,
                                            hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE)


FAMILIES = {
    "gpt2": (_gpt2, ("query", "key", "value", "attention_output", "ffn_in", "ffn_out")),
    "llama": (_llama, lora_targets.ALL_TARGETS),
    "mistral": (_mistral, lora_targets.ALL_TARGETS),
}


def _inputs(token_ids):
    token_ids = np.asarray(token_ids, np.int32)
    return {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}


def _logits(backbone, token_ids):
    hidden = backbone(_inputs(token_ids))
    return backbone.token_embedding(hidden, reverse=True).numpy()


def _tokens(seed=0):
    return np.random.default_rng(seed).integers(1, VOCAB, size=(2, LENGTH))


def _randomize_b(adapters, seed=1):
    rng = np.random.default_rng(seed)
    for adapter in adapters.values():
        adapter.lora_b.assign(rng.normal(0, 0.5, adapter.lora_b.shape).astype(np.float32))


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    tf.keras.utils.set_random_seed(0)
    build, targets = FAMILIES[request.param]
    return build(), targets


def test_lora_with_b_zero_gives_exactly_the_base_logits(family):
    backbone, targets = family
    tokens = _tokens()
    base = _logits(backbone, tokens)
    adapters = apply_lora(backbone, LoraConfig(rank=2, targets=targets))
    assert len(adapters) == 2 * len(targets)
    np.testing.assert_array_equal(_logits(backbone, tokens), base)


def test_trainable_weights_are_the_factors_and_merging_gives_the_same_logits(family):
    backbone, targets = family
    adapters = apply_lora(backbone, LoraConfig(rank=2, targets=targets, layers=(1,)))
    expected = sum(2 * (a.d_in + a.d_out) for a in adapters.values())
    assert sum(int(np.prod(v.shape)) for v in backbone.trainable_variables) == expected
    _randomize_b(adapters)
    tokens = _tokens()
    adapted = _logits(backbone, tokens)
    for adapter in adapters.values():   # W0 + (α/r)·A·B in the kernel, LoRA path off
        adapter.merge()
    np.testing.assert_allclose(_logits(backbone, tokens), adapted, rtol=1e-4, atol=1e-5)
    for adapter in adapters.values():
        adapter.unmerge()
    np.testing.assert_allclose(_logits(backbone, tokens), adapted, rtol=1e-4, atol=1e-5)
    # The adapters are on the forward path: B = 0 again gives different logits.
    for adapter in adapters.values():
        adapter.lora_b.assign(tf.zeros_like(adapter.lora_b))
    assert np.abs(_logits(backbone, tokens) - adapted).max() > 1e-3


def test_the_causal_mask_holds_with_adapters(family):
    backbone, targets = family
    _randomize_b(apply_lora(backbone, LoraConfig(rank=2, targets=targets)))
    tokens = _tokens()
    changed = tokens.copy()
    changed[:, 4:] = (changed[:, 4:] + 7) % (VOCAB - 1) + 1
    before, after = _logits(backbone, tokens), _logits(backbone, changed)
    np.testing.assert_allclose(after[:, :4], before[:, :4], rtol=1e-5, atol=1e-6)
    assert np.abs(after[:, 4:] - before[:, 4:]).max() > 1e-3


def test_a_target_the_family_lacks_is_refused_and_nothing_changes():
    backbone = _gpt2()
    with pytest.raises(ValueError, match="TransformerDecoder has no 'ffn_gate' projection"):
        apply_lora(backbone, LoraConfig(rank=2, targets=("query", "ffn_gate")))
    assert not lora_targets.lora_layers(backbone)
    assert lora_targets.layer_targets(_llama().transformer_layers[0]) is lora_targets.GATED_TARGETS
