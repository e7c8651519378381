"""models.prefix: where the trained part of a classifier starts, and prefix → suffix = whole."""

import numpy as np
import pytest
import tensorflow as tf

from models import backbones
from models import lora_targets
from models import prefix
from tffl.engine.feature_cache import stochastic_layers


def _classifier(kind="bert", layers=(2, 3), dropout=0.0, num_layers=4, pooling="mean",
                head="linear"):
    build = backbones.build_bert_backbone if kind == "bert" else backbones.build_roberta_backbone
    backbone = build(vocabulary_size=40, num_layers=num_layers, num_heads=2, hidden_dim=16,
                     intermediate_dim=32, dropout=dropout, max_sequence_length=10)
    config = lora_targets.LoraConfig(rank=2, targets=("query", "value"), layers=layers, seed=1)
    lora_targets.apply_lora(backbone, config)
    return backbones.build_classifier(backbone, 3, seed=2, pooling=pooling, head=head), config


def _batch(backbone, lengths=(3, 10, 6)):
    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    batch = {"token_ids": rng.integers(1, 40, mask.shape).astype(np.int32) * mask,
             "padding_mask": mask}
    if "segment_ids" in backbone.input:
        batch["segment_ids"] = np.zeros_like(mask)
    return batch


HEADS = (("bert", "mean", "linear"), ("roberta", "cls", "linear"),
         ("bert", "pooler", "dense_tanh"), ("roberta", "mean", "dense_tanh"))
SPLITS = (((2, 3), 2), ((0, 3), 0), ((3,), 3))
# The fast tier covers every head and every split, each split on both families; the large tier
# adds the rest of the product (each case builds two KerasNLP models, the test's whole cost).
FAST_CASES = {(HEADS[0], SPLITS[0]), (HEADS[1], SPLITS[1]), (HEADS[2], SPLITS[2]),
              (HEADS[3], SPLITS[0]), (HEADS[2], SPLITS[1])}


@pytest.mark.parametrize("kind,pooling,head,layers,start", [
    pytest.param(*heads, *split, id="-".join(heads) + f"-from_layer_{split[1]}",
                 marks=() if (heads, split) in FAST_CASES else pytest.mark.large)
    for split in SPLITS for heads in HEADS])
def test_suffix_of_prefix_is_the_whole_classifier(kind, pooling, head, layers, start):
    model, config = _classifier(kind, layers, pooling=pooling, head=head)
    # Weights of std 0.3, so that every layer changes its input (0.02 is nearly the identity).
    for v in model.non_trainable_variables + model.trainable_variables:
        if len(v.shape) >= 2:
            v.assign(tf.random.stateless_normal(v.shape, [len(v.name), 7]) * 0.3)
    assert prefix.trained_start_layer(model, stochastic_layers) == start
    backbone = prefix.find_backbone(model)
    spec = prefix.SuffixSpec.from_backbone(backbone, start, pooling=pooling, head=head)
    suffix = spec.build_classifier(config, num_classes=3, seed=2)
    assert [v.name for v in suffix.trainable_variables] == [
        v.name for v in model.trainable_variables if "embedding" not in v.name
        and not any(f"transformer_layer_{i}/" in v.name for i in range(start))]
    # Only encoders start..3 (and the pooler and head) exist in the suffix.
    names = {layer.name for layer in suffix._flatten_layers()}
    assert {f"transformer_layer_{i}" in names for i in range(4)} == (
        {True} if start == 0 else {True, False})
    assert not any("embedding" in v.name for v in suffix.variables)
    for variable, source in zip(suffix.variables, prefix.matching_variables(model, suffix)):
        variable.assign(source)
    trainable, non_trainable = prefix.matching_positions(model, suffix)
    assert [model.trainable_variables[p].shape for p in trainable] == [
        v.shape for v in suffix.trainable_variables]
    assert len(non_trainable) == len(suffix.non_trainable_variables)
    batch = _batch(backbone)
    hidden = prefix.build_prefix_model(backbone, start)(batch)
    assert hidden["hidden"].shape == (3, 10, 16)
    whole = model(batch)
    np.testing.assert_allclose(suffix(hidden), whole, atol=1e-5)
    # The suffix ignores padding: each example cut to its own length gives the same logits.
    for row, n in enumerate((3, 10, 6)):
        one = {k: v[row:row + 1, :n] for k, v in hidden.items()}
        np.testing.assert_allclose(suffix(one)[0], whole[row], atol=1e-5)


def test_only_the_head_trained_starts_after_the_last_encoder():
    model, _ = _classifier(layers=(3,))
    backbone = prefix.find_backbone(model)
    for encoder in backbone.transformer_layers:
        encoder.trainable = False
    assert prefix.trained_start_layer(model, stochastic_layers) == 4
    out = prefix.build_prefix_model(backbone, 4)(_batch(backbone))
    np.testing.assert_allclose(out["hidden"], backbone(_batch(backbone))["sequence_output"],
                               atol=1e-6)


def test_no_cache_with_dropout_below_or_trainable_embeddings():
    model, _ = _classifier(dropout=0.1)
    assert prefix.trained_start_layer(model, stochastic_layers) is None
    model, _ = _classifier()
    prefix.find_backbone(model).get_layer("token_embedding").trainable = True
    assert prefix.trained_start_layer(model, stochastic_layers) is None


def test_bad_split_points_raise():
    model, config = _classifier()
    backbone = prefix.find_backbone(model)
    with pytest.raises(ValueError, match="start_layer=5"):
        prefix.build_prefix_model(backbone, 5)
    with pytest.raises(ValueError, match="start_layer=-1"):
        prefix.SuffixSpec.from_backbone(backbone, -1)
    spec = prefix.SuffixSpec.from_backbone(backbone, 3)
    with pytest.raises(ValueError, match="below the suffix's first layer 3"):
        spec.build_classifier(config, num_classes=3)
    with pytest.raises(ValueError, match="no KerasNLP backbone"):
        prefix.find_backbone(tf.keras.Sequential([tf.keras.layers.Dense(2)]))
