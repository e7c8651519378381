"""models.peft_export.init_adapters: a run starts from an exported PEFT adapter folder.

A model with random adapters and head is exported (`export_peft`); a fresh model on the same
frozen backbone takes them back exactly (same variables, same logits), and a folder that does not
fit (another rank, other targets, another head) is a one-line error naming the flag to change.
"""

import collections
import json

import keras_nlp
import numpy as np
import pytest
import tensorflow as tf

from models import backbones, peft_export
from models.lora_targets import LoraConfig, apply_lora, lora_layers

TINY = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=16, dropout=0.0)
INPUTS = collections.OrderedDict(
    (k, tf.TensorSpec([None, None], tf.int32)) for k in ("padding_mask", "segment_ids",
                                                          "token_ids"))
INPUT_SPEC = (INPUTS, tf.TensorSpec([None], tf.int32))


def _model_fn(rank=2, alpha=3.0, targets=("query", "value"), num_classes=3, head="linear"):
    def build():
        backbone = keras_nlp.models.BertBackbone(**TINY)
        apply_lora(backbone, LoraConfig(rank=rank, alpha=alpha, targets=targets))
        return backbones.build_classifier(backbone, num_classes, pooling="cls", head=head)
    return build


def _with_base(model, base_seed=0, adapter_seed=None):
    """`model` with every weight re-drawn from `base_seed`; with `adapter_seed`, its LoRA factors
    and head (its trainable weights) re-drawn from that one (non-zero)."""
    rng = np.random.default_rng(base_seed)
    for v in model.weights:
        v.assign(rng.normal(0.0, 0.3, v.shape).astype(np.float32))
    if adapter_seed is not None:
        rng = np.random.default_rng(adapter_seed)
        for v in model.trainable_variables:
            v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))
    return model


def _inputs():
    ids = np.random.default_rng(1).integers(3, TINY["vocabulary_size"], (2, 7)).astype(np.int32)
    return {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the trained model, its PEFT folder): built once, only read by the tests."""
    trained = _with_base(_model_fn()(), adapter_seed=7)
    folder = peft_export.export_peft(trained, tmp_path_factory.mktemp("run") / "adapters")
    return trained, folder


def test_a_fresh_model_takes_the_adapters_and_head_exactly(exported):
    trained, folder = exported
    fresh = _with_base(_model_fn()())           # the same frozen backbone, B = 0, its own head
    before = fresh(_inputs()).numpy()
    names = peft_export.init_adapters(fresh, folder)
    assert len(names) == len(trained.trainable_variables) == 2 * 2 * 2 + 2
    assert names[:2] == ["transformer_layer_0_query_lora/lora_a:0",
                         "transformer_layer_0_query_lora/lora_b:0"]
    assert sorted(names) == sorted(v.name for v in fresh.trainable_variables)
    for t, f in zip(trained.trainable_variables, fresh.trainable_variables, strict=True):
        np.testing.assert_array_equal(f.numpy(), t.numpy())
    logits = fresh(_inputs()).numpy()
    np.testing.assert_array_equal(logits, trained(_inputs()).numpy())
    assert not np.allclose(logits, before)


def test_another_lora_alpha_keeps_the_update(exported):
    trained, folder = exported
    fresh = _with_base(_model_fn(alpha=6.0)())
    peft_export.init_adapters(fresh, folder)
    np.testing.assert_allclose(fresh(_inputs()).numpy(), trained(_inputs()).numpy(), atol=1e-5)


@pytest.mark.parametrize("options,message", [
    (dict(rank=4), r"its adapters have rank 2, this run's 4: set rank=2$"),
    (dict(targets=("query", "key", "value")),
     r"it adapts query,value of layers 0,1, this run query,key,value of layers 0,1 \(e\.g\. "
     r"bert\.encoder\.layer\.0\.attention\.self\.key is only this run's\): set `lora_targets`"),
    (dict(num_classes=2), r"base_model\.model\.classifier\.weight: file \(3, 8\) does not "
                          r"fit the model's \(8, 2\) \(transposed\): set `backbone`.*`task`$"),
    (dict(head="dense_tanh"), r"it holds a trained classifier that this run's model lacks: "
                              r"set `head` and `pooling`"),
])
def test_a_folder_that_does_not_fit_is_a_one_line_error_naming_the_parameter(exported, options,
                                                                         message):
    _, folder = exported
    fresh = _with_base(_model_fn(**options)())
    kept = [v.numpy() for v in fresh.weights]
    with pytest.raises(ValueError, match=f"^init_adapters={folder}: " + message) as error:
        peft_export.init_adapters(fresh, folder)
    assert "\n" not in str(error.value)
    for value, v in zip(kept, fresh.weights, strict=True):   # nothing was set
        np.testing.assert_array_equal(v.numpy(), value)


def test_a_folder_without_an_export_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"^init_adapters={tmp_path}: no adapter_config.json"):
        peft_export.init_adapters(_model_fn()(), tmp_path)


def test_a_process_starts_from_the_folder(exported):
    """`runner.training.initial_weights_with_adapters`: the starting weights a process builder
    takes (`initial_trainable=`, `initial_non_trainable=`), here given the trained model's frozen
    backbone, rebuild the trained classifier."""
    from runner import training

    trained, folder = exported
    frozen = [v.numpy() for v in trained.non_trainable_variables]
    trainable, non_trainable, names = training.initial_weights_with_adapters(
        _model_fn(), INPUT_SPEC, folder, initial_non_trainable=frozen)
    assert len(names) == len(trainable)
    model = _model_fn()()
    model(_inputs())
    for v, value in zip(model.trainable_variables + model.non_trainable_variables,
                        trainable + non_trainable, strict=True):
        v.assign(value)
    np.testing.assert_array_equal(model(_inputs()).numpy(), trained(_inputs()).numpy())
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 2
    assert len(lora_layers(model)) == 4
