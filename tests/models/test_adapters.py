"""merge / unmerge over a whole backbone, parameter counts."""

import numpy as np
import tensorflow as tf

from models.adapters import lora_parameter_count, merge_lora, unmerge_lora
from models.backbones import build_bert_backbone, dummy_batch
from models.lora_targets import LoraConfig, apply_lora


def _adapted(rank=2, targets=("query", "value", "ffn_in")):
    tf.keras.utils.set_random_seed(0)  # same frozen backbone weights on every call
    backbone = build_bert_backbone(vocabulary_size=32, num_layers=2, num_heads=2, hidden_dim=8,
                                   intermediate_dim=12, max_sequence_length=8)
    adapters = apply_lora(backbone, LoraConfig(rank=rank, alpha=3.0, targets=targets))
    rng = np.random.default_rng(0)
    for layer in adapters.values():
        layer.lora_b.assign(rng.normal(size=layer.lora_b.shape).astype(np.float32))
    return backbone, adapters


def test_merge_equals_unmerged_and_restores():
    backbone, adapters = _adapted()
    batch = dummy_batch(backbone, batch_size=2, seq_len=5)
    before = backbone(batch)["sequence_output"].numpy()
    kernels = {k: a.layer.kernel.numpy().copy() for k, a in adapters.items()}
    assert merge_lora(backbone) == 6
    np.testing.assert_allclose(backbone(batch)["sequence_output"].numpy(), before, atol=1e-4)
    for key, a in adapters.items():
        delta = 1.5 * a.lora_a.numpy() @ a.lora_b.numpy()
        np.testing.assert_allclose(a.layer.kernel.numpy(),
                                   kernels[key] + delta.reshape(kernels[key].shape), atol=1e-6)
    unmerge_lora(backbone)
    for key, a in adapters.items():
        np.testing.assert_allclose(a.layer.kernel.numpy(), kernels[key], atol=1e-6)


def test_parameter_count_formula():
    backbone, _ = _adapted(rank=2)
    # per layer: query 2(8+8) + value 2(8+8) + ffn_in 2(8+12) = 104; two layers.
    assert lora_parameter_count(backbone) == 208
    assert sum(int(np.prod(v.shape)) for v in backbone.trainable_variables) == 208
