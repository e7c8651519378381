"""merge / unmerge over a whole backbone, adapter-only save / load, parameter counts."""

import numpy as np
import pytest
import tensorflow as tf

from models.adapters import (adapter_state, load_adapters, lora_parameter_count, merge_lora,
                             save_adapters, unmerge_lora)
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


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_load_round_trip_only_lora(tmp_path, suffix):
    source, _ = _adapted()
    path = save_adapters(source, tmp_path / f"adapters{suffix}")
    state = adapter_state(source)
    assert len(state) == 12 and all(k.endswith(("/lora_a", "/lora_b")) for k in state)
    assert path.stat().st_size < 4 * sum(v.size for v in state.values()) + 4096
    target, _ = _adapted()
    for v in target.trainable_variables:
        v.assign(tf.zeros_like(v))
    load_adapters(target, path)
    for key, value in adapter_state(target).items():
        np.testing.assert_array_equal(value, state[key])


def test_load_errors_name_mismatches(tmp_path):
    source, _ = _adapted(rank=2)
    path = save_adapters(source, tmp_path / "a.npz")
    other_rank, _ = _adapted(rank=3)
    with pytest.raises(ValueError, match=r"shape mismatches: .*query_lora/lora_a: file \(8, 2\)"):
        load_adapters(other_rank, path)
    other_targets, _ = _adapted(targets=("key",))
    with pytest.raises(ValueError, match=r"missing \['transformer_layer_0_key_lora/lora_a'"):
        load_adapters(other_targets, path)
    with pytest.raises(ValueError, match=r"\.npz or \.safetensors"):
        save_adapters(source, tmp_path / "a.pt")
    with pytest.raises(ValueError, match="no LoRA adapters"):
        save_adapters(tf.keras.Sequential([tf.keras.layers.Dense(2)]), tmp_path / "b.npz")


def test_load_into_merged_model_keeps_it_merged(tmp_path):
    source, _ = _adapted()
    path = save_adapters(source, tmp_path / "a.npz")
    target, adapters = _adapted()
    for layer in adapters.values():
        layer.lora_b.assign(tf.zeros_like(layer.lora_b))
    batch = dummy_batch(source, batch_size=2, seq_len=5)
    merge_lora(target)
    load_adapters(target, path)
    assert all(a.merged for a in adapters.values())
    unmerge_lora(target)
    np.testing.assert_allclose(target(batch)["sequence_output"].numpy(),
                               source(batch)["sequence_output"].numpy(), atol=1e-4)
