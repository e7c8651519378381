"""PEFT export / import of a Gemma 3 decoder's LoRA adapters (models.peft_export, models.peft_names).

The reference is what Hugging Face computes, in numpy: PEFT's LoRA formula
y = x·Wᵀ + (lora_alpha/r)·x·Aᵀ·Bᵀ on the HF module's weight W, and a whole Gemma 3 forward pass
(tests/models/gemma3_reference.py) over the base tensors with the adapters merged as PEFT merges
them (W + (α/r)·B·A). Which GGUF tensor an HF module's weight is comes from the `gguf` package's
own name map (llama.cpp's), not from our code: a wrong module name or layout cannot pass.
"""

import json
import re

import gguf
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from models import gguf_checkpoint, peft_export
from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig
from models.lora_targets import LoraConfig, apply_lora, lora_layers
from tests.models.gemma3_reference import numpy_logits, random_gguf_tensors

TINY = {"vocabulary_size": 64, "num_layers": 3, "num_query_heads": 2, "num_key_value_heads": 1,
        "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8, "sliding_window": 2,
        "global_layer_every": 3, "layer_norm_epsilon": 1e-6, "global_rope_base": 1e6,
        "local_rope_base": 1e4}
RANK, ALPHA = 2, 3.0
SEVEN = ("query", "key", "value", "attention_output", "ffn_gate", "ffn_in", "ffn_out")
# Gemma3ForCausalLM's module of each target (transformers' modeling_gemma3).
HF_MODULE = {"query": "self_attn.q_proj", "key": "self_attn.k_proj", "value": "self_attn.v_proj",
             "attention_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_in": "mlp.up_proj", "ffn_out": "mlp.down_proj"}
GGUF_NAMES = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, TINY["num_layers"])


def _model(targets=SEVEN, layers=(1, 2), seed=0):
    """(tiny Gemma 3 with random GGUF weights and random non-zero LoRA factors, its tensors)."""
    backbone = Gemma3Backbone(Gemma3BackboneConfig(**TINY))
    tensors, _ = random_gguf_tensors(TINY, quantize=False)
    gguf_checkpoint.assign_gguf_weights(backbone, tensors)
    apply_lora(backbone, LoraConfig(rank=RANK, alpha=ALPHA, targets=targets, layers=layers))
    rng = np.random.default_rng(seed)
    for wrapper in lora_layers(backbone):
        for v in (wrapper.lora_a, wrapper.lora_b):
            v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))
    return backbone, tensors


def _exported(backbone, folder):
    peft_export.export_peft(backbone, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    return config, safetensors.numpy.load_file(str(folder / "adapter_model.safetensors"))


def _base_weight(tensors, layer, target):
    """HF's weight (out, in) of a module: its GGUF tensor, found by llama.cpp's name map."""
    return tensors[GGUF_NAMES.get_name(f"model.layers.{layer}.{HF_MODULE[target]}")]


def test_every_projection_matches_peft_formula_on_the_hf_weight(tmp_path):
    backbone, tensors = _model()
    config, peft = _exported(backbone, tmp_path)
    assert (config["task_type"], config["r"], config["lora_alpha"]) == ("CAUSAL_LM", RANK, ALPHA)
    scale = config["lora_alpha"] / config["r"]
    rng = np.random.default_rng(2)
    checked = 0
    for layer in (1, 2):
        for target in SEVEN:
            path = f"base_model.model.model.layers.{layer}.{HF_MODULE[target]}"
            a, b = peft[f"{path}.lora_A.weight"], peft[f"{path}.lora_B.weight"]
            weight = _base_weight(tensors, layer, target)
            assert a.shape == (RANK, weight.shape[1]) and b.shape == (weight.shape[0], RANK)
            wrapper = next(w for w in lora_layers(backbone)
                           if w.name == f"transformer_layer_{layer}_{target}_lora")
            x = rng.normal(size=(3, 5, weight.shape[1])).astype(np.float32)
            delta = scale * x @ a.T @ b.T
            expected = x @ weight.T + delta
            ours = wrapper(tf.constant(x)).numpy().reshape(3, 5, -1)
            assert np.abs(delta).max() > 0.1   # the adapter matters
            np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0,
                                       err_msg=f"layer {layer} {target}")
            checked += 1
    assert checked == 14 and len(peft) == 28   # 2 layers x 7 modules x (A, B), no head


def test_logits_match_numpy_hf_forward_with_peft_merged(tmp_path):
    backbone, tensors = _model()
    config, peft = _exported(backbone, tmp_path)
    scale = config["lora_alpha"] / config["r"]
    merged = dict(tensors)
    for key in peft:
        match = re.fullmatch(r"base_model\.model\.(model\.layers\.\d+\..+)\.lora_A\.weight", key)
        if match:
            name = GGUF_NAMES.get_name(match.group(1))
            b = peft[key.replace("lora_A", "lora_B")]
            merged[name] = tensors[name] + scale * b @ peft[key]          # PEFT's merge
    ids = np.random.default_rng(4).integers(1, TINY["vocabulary_size"], 7)
    hidden = backbone({"token_ids": ids[None].astype(np.int32),
                       "padding_mask": np.ones((1, 7), np.int32)})
    ours = backbone.token_embedding(hidden, reverse=True).numpy()[0]
    unmerged = numpy_logits(tensors, TINY, ids)
    assert np.abs(ours - unmerged).max() > 1e-2   # the adapters change the logits
    np.testing.assert_allclose(ours, numpy_logits(merged, TINY, ids), rtol=1e-5, atol=1e-4)


def test_target_modules_names_or_exact_regex(tmp_path):
    every_layer, _ = _model(targets=("query", "value"), layers=None)
    config, _ = _exported(every_layer, tmp_path / "all")
    assert config["target_modules"] == ["q_proj", "v_proj"]
    some_layers, _ = _model()
    config, _ = _exported(some_layers, tmp_path / "some")
    pattern = re.compile(config["target_modules"])
    assert pattern.fullmatch("model.layers.2.mlp.gate_proj")
    assert pattern.fullmatch("model.layers.1.self_attn.o_proj")
    assert not pattern.fullmatch("model.layers.0.self_attn.q_proj")
    head = json.loads((tmp_path / "some" / "tffl_head.json").read_text())
    assert head["family"] == "gemma3" and head["head"] is None


def test_import_of_the_export_gives_identical_adapters(tmp_path):
    source, _ = _model(seed=0)
    peft_export.export_peft(source, tmp_path)
    target, _ = _model(seed=1)
    peft_export.import_peft(target, tmp_path)
    for ours, theirs in zip(lora_layers(target), lora_layers(source), strict=True):
        np.testing.assert_array_equal(ours.lora_a.numpy(), theirs.lora_a.numpy())
        np.testing.assert_array_equal(ours.lora_b.numpy(), theirs.lora_b.numpy())
    elsewhere, _ = _model(layers=(0, 1))
    with pytest.raises(ValueError, match="lora_layers"):
        peft_export.init_adapters(elsewhere, tmp_path)


def test_the_lora_configuration_of_a_folder_rebuilds_its_adapters(tmp_path):
    source, _ = _model(targets=("query", "ffn_gate", "value"), layers=(0, 2))
    peft_export.export_peft(source, tmp_path / "ok")
    config = peft_export.folder_lora_config(tmp_path / "ok")
    assert (config.rank, config.alpha, config.targets, config.layers) == (
        RANK, ALPHA, ("query", "value", "ffn_gate"), (0, 2))
    target = Gemma3Backbone(Gemma3BackboneConfig(**TINY))
    apply_lora(target, config)
    peft_export.import_peft(target, tmp_path / "ok")   # every tensor has its place
    tensors = safetensors.numpy.load_file(str(tmp_path / "ok" / "adapter_model.safetensors"))
    dropped = {k: v for k, v in tensors.items() if "layers.2.mlp.gate_proj" not in k}
    (tmp_path / "partial").mkdir()
    safetensors.numpy.save_file(dropped, str(tmp_path / "partial" / "adapter_model.safetensors"))
    (tmp_path / "partial" / "adapter_config.json").write_text(
        (tmp_path / "ok" / "adapter_config.json").read_text())
    with pytest.raises(ValueError, match=r"partial: it adapts query,value,ffn_gate of layers 0,2 "
                                         r"but not ffn_gate of layer 2"):
        peft_export.folder_lora_config(tmp_path / "partial")


def test_a_decoder_without_separate_projections_is_one_line(tmp_path):
    import keras_nlp

    gpt2 = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=2,
                                         hidden_dim=8, intermediate_dim=16,
                                         max_sequence_length=8)
    apply_lora(gpt2, LoraConfig(rank=2, targets=("query",)))
    with pytest.raises(ValueError, match="no KerasNLP BERT / RoBERTa backbone or Gemma 3"):
        peft_export.export_peft(gpt2, tmp_path)


def test_a_run_starts_from_an_exported_decoder_folder(tmp_path):
    """`runner.training.initial_weights_with_adapters` (train.py --init_adapters) on the causal LM
    a decoder run trains: its trainable variables are the folder's factors, nothing else
    changes."""
    import collections

    from models import causal_lm
    from runner import training

    source, _ = _model(targets=("query", "value"), layers=(2,))
    peft_export.export_peft(source, tmp_path)

    def keras_model_fn():
        backbone = Gemma3Backbone(Gemma3BackboneConfig(**TINY))
        apply_lora(backbone, LoraConfig(rank=RANK, alpha=ALPHA, targets=("query", "value"),
                                        layers=(2,)))
        return causal_lm.build_causal_lm(backbone)

    spec = (collections.OrderedDict((k, tf.TensorSpec([None, None], tf.int32))
                                    for k in ("padding_mask", "response_mask", "token_ids")),
            tf.TensorSpec([None], tf.int32))
    trainable, _, names = training.initial_weights_with_adapters(keras_model_fn, spec,
                                                                    tmp_path)
    expected = [v.numpy() for w in lora_layers(source) for v in (w.lora_a, w.lora_b)]
    assert len(names) == len(trainable) == len(expected) == 4
    for got, want in zip(trainable, expected, strict=True):
        np.testing.assert_array_equal(got, want)
