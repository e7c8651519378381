"""PEFT LoRA export / import (models.peft_export) and HF weight names (models.hf_weights).

The reference is a numpy implementation of what Hugging Face computes: PEFT's LoRA formula
y = x·Wᵀ + b + (lora_alpha/r)·x·Aᵀ·Bᵀ on torch-convention weights, and a whole
BertForSequenceClassification / RobertaForSequenceClassification forward pass over the exported
base weights with the adapters merged as PEFT merges them (W + (α/r)·B·A).
"""

import functools
import json
import math

import keras_nlp
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from models import backbones, hf_bert, hf_weights, peft_export
from models.lora_targets import LoraConfig, apply_lora, lora_layers

RANK, ALPHA = 2, 3.0
TINY = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=16, dropout=0.0)
CLASSIFIER = {"bert": ("pooler", "linear"), "roberta": ("cls", "dense_tanh")}


def _backbone(family):
    cls = {"bert": keras_nlp.models.BertBackbone, "roberta": keras_nlp.models.RobertaBackbone}
    return cls[family](**TINY)


def _randomize(variables, rng, scale):
    for v in variables:
        v.assign(rng.normal(0.0, scale, v.shape).astype(np.float32))


def _model(family, seed=0, alpha=ALPHA):
    """A tiny classifier with LoRA (rank 2, α 3) on query and value, every LoRA factor and head
    weight random and non-zero; base weights at KerasNLP's random init (re-drawn larger)."""
    rng = np.random.default_rng(seed)
    backbone = _backbone(family)
    _randomize(backbone.weights, rng, 0.3)
    apply_lora(backbone, LoraConfig(rank=RANK, alpha=alpha, targets=("query", "value")))
    pooling, head = CLASSIFIER[family]
    model = backbones.build_classifier(backbone, num_classes=3, pooling=pooling, head=head)
    for layer in lora_layers(model):
        _randomize([layer.lora_a, layer.lora_b], rng, 0.5)
    _randomize(model.trainable_variables, rng, 0.5)  # LoRA factors and head, re-drawn
    return model, backbone


@functools.cache
def _source(family):
    """`_model(family)` (seed 0, α 3), built once per module: the tests only read it (export it,
    call it, compare against it)."""
    return _model(family)


def _inputs(family, seed=1, batch=2, seq=7):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, TINY["vocabulary_size"], (batch, seq)).astype(np.int32)
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    if family == "bert":
        x["segment_ids"] = np.zeros_like(ids)
    return x


@pytest.fixture(params=["bert", "roberta"])
def family(request):
    return request.param


# -- the adapted projection, by PEFT's formula ------------------------------------------------


@pytest.mark.parametrize("layer_index,target", [(0, "query"), (1, "value")])
def test_projection_matches_peft_formula(family, tmp_path, layer_index, target):
    model, backbone = _source(family)
    peft_export.export_peft(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    tensors = safetensors.numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    path = f"base_model.model.{family}.encoder.layer.{layer_index}.attention.self.{target}"
    a, b = tensors[f"{path}.lora_A.weight"], tensors[f"{path}.lora_B.weight"]
    assert a.shape == (RANK, 8) and b.shape == (8, RANK)

    attention = backbone.transformer_layers[layer_index]._self_attention_layer
    wrapper = getattr(attention, f"_{target}_dense")
    kernel = wrapper.layer.kernel.numpy()   # (hidden, heads, head_dim)
    w_hf = kernel.reshape(8, 8).T           # torch (out, in)
    b_hf = wrapper.layer.bias.numpy().reshape(8)
    base = hf_weights.to_hf_tensors(backbone)
    np.testing.assert_array_equal(
        base[f"{family}.encoder.layer.{layer_index}.attention.self.{target}.weight"], w_hf)

    x = np.random.default_rng(2).normal(size=(3, 5, 8)).astype(np.float32)
    scale = config["lora_alpha"] / config["r"]
    delta = scale * x @ a.T @ b.T
    expected = x @ w_hf.T + b_hf + delta
    ours = wrapper(tf.constant(x)).numpy().reshape(3, 5, 8)
    assert np.abs(delta).max() > 0.1  # the adapter matters: a wrong mapping cannot pass
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)


def test_config_and_head_files(family, tmp_path):
    model, _ = _source(family)
    peft_export.export_peft(model, tmp_path, base_model_name_or_path="some/base")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "SEQ_CLS"
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    assert config["target_modules"] == ["query", "value"]
    assert config["lora_dropout"] == 0.0 and config["bias"] == "none"
    assert config["fan_in_fan_out"] is False
    assert config["base_model_name_or_path"] == "some/base"
    expected_save = ["classifier", "pooler"] if family == "bert" else ["classifier"]
    assert config["modules_to_save"] == expected_save
    head = json.loads((tmp_path / "tffl_head.json").read_text())
    assert head["hf_equivalent"] == {"bert": "BertForSequenceClassification",
                                     "roberta": "RobertaForSequenceClassification"}[family]


def test_partial_layers_give_an_exact_regex(tmp_path):
    import re

    backbone = _backbone("bert")
    apply_lora(backbone, LoraConfig(rank=RANK, targets=("value", "ffn_out"), layers=(1,)))
    peft_export.export_peft(backbone, tmp_path)
    pattern = json.loads((tmp_path / "adapter_config.json").read_text())["target_modules"]
    names = [f"bert.encoder.layer.{i}.{m}" for i in range(2) for m in (
        "attention.self.query", "attention.self.value", "attention.output.dense",
        "intermediate.dense", "output.dense")]
    assert [n for n in names if re.fullmatch(pattern, n)] == [
        "bert.encoder.layer.1.attention.self.value", "bert.encoder.layer.1.output.dense"]


# -- import ---------------------------------------------------------------------------------


def test_import_of_the_export_gives_identical_adapters(family, tmp_path):
    source, _ = _source(family)
    peft_export.export_peft(source, tmp_path)
    target, _ = _model(family, seed=5)
    peft_export.import_peft(target, tmp_path)
    pairs = list(zip(source.trainable_variables, target.trainable_variables, strict=True))
    assert len(pairs) == 4 * 2 + {"bert": 4, "roberta": 4}[family]
    for s, t in pairs:
        np.testing.assert_array_equal(s.numpy(), t.numpy())


def test_import_rescales_b_for_another_alpha(tmp_path):
    source, _ = _source("bert")
    peft_export.export_peft(source, tmp_path)
    target, _ = _model("bert", seed=5, alpha=1.0)
    peft_export.import_peft(target, tmp_path)
    for s, t in zip(lora_layers(source), lora_layers(target)):
        np.testing.assert_allclose(t.delta_kernel().numpy(), s.delta_kernel().numpy(),
                                   atol=1e-6)


def test_import_refuses_another_placement(tmp_path):
    source, _ = _source("bert")
    peft_export.export_peft(source, tmp_path)
    other = _backbone("bert")
    apply_lora(other, LoraConfig(rank=RANK, targets=("key",)))
    before = [v.numpy() for v in other.trainable_variables]
    with pytest.raises(ValueError, match="no tensor"):
        peft_export.import_peft(other, tmp_path)
    for v, b in zip(other.trainable_variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


# -- the whole model, as Hugging Face computes it -------------------------------------------


def _layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _gelu(x, act):
    if act == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _merged(t, adapters, config):
    """PEFT's merge: W ← W + (lora_alpha/r)·B·A for every adapted module."""
    t = dict(t)
    scale = config["lora_alpha"] / config["r"]
    for key, a in adapters.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapters[key.replace("lora_A", "lora_B")]
            t[module + ".weight"] = t[module + ".weight"] + scale * b @ a
    for key, v in adapters.items():
        if "lora_" not in key:
            t[key.removeprefix("base_model.model.")] = v
    return {k: v.astype(np.float64) for k, v in t.items()}


def _hf_forward(t, hf_config, family, ids):
    """HF Bert/RobertaForSequenceClassification logits (numpy; no padding in `ids`)."""
    p, eps, act = family + ".", hf_config["layer_norm_eps"], hf_config["hidden_act"]
    heads = hf_config["num_attention_heads"]
    seq = ids.shape[1]
    positions = np.arange(seq) + (2 if family == "roberta" else 0)
    x = (t[p + "embeddings.word_embeddings.weight"][ids]
         + t[p + "embeddings.position_embeddings.weight"][positions]
         + t[p + "embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, t[p + "embeddings.LayerNorm.weight"], t[p + "embeddings.LayerNorm.bias"], eps)

    def linear(h, name):
        return h @ t[name + ".weight"].T + t[name + ".bias"]

    for i in range(hf_config["num_hidden_layers"]):
        q = p + f"encoder.layer.{i}."
        split = [linear(x, q + f"attention.self.{n}").reshape(*x.shape[:2], heads, -1)
                 for n in ("query", "key", "value")]
        scores = np.einsum("bqhd,bkhd->bhqk", split[0], split[1]) / math.sqrt(split[0].shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = np.einsum("bhqk,bkhd->bqhd", probs, split[2]).reshape(x.shape)
        x = _layer_norm(linear(ctx, q + "attention.output.dense") + x,
                        t[q + "attention.output.LayerNorm.weight"],
                        t[q + "attention.output.LayerNorm.bias"], eps)
        h = _gelu(linear(x, q + "intermediate.dense"), act)
        x = _layer_norm(linear(h, q + "output.dense") + x, t[q + "output.LayerNorm.weight"],
                        t[q + "output.LayerNorm.bias"], eps)
    first = x[:, 0]
    if family == "bert":
        return linear(np.tanh(linear(first, "bert.pooler.dense")), "classifier")
    return linear(np.tanh(linear(first, "classifier.dense")), "classifier.out_proj")


def test_whole_model_logits_match_hf_with_peft_merged(family, tmp_path):
    model, backbone = _source(family)
    peft_export.export_peft(model, tmp_path / "adapter")
    hf_weights.save_hf_checkpoint(backbone, tmp_path / "base")
    hf_config = json.loads((tmp_path / "base" / "config.json").read_text())
    base = safetensors.numpy.load_file(str(tmp_path / "base" / "model.safetensors"))
    config, adapters = peft_export.read_peft(tmp_path / "adapter")
    inputs = _inputs(family)
    ours = model(inputs).numpy()
    expected = _hf_forward(_merged(base, adapters, config), hf_config, family, inputs["token_ids"])
    without_lora = _hf_forward(_merged(base, {k: v for k, v in adapters.items()
                                              if "lora_" not in k}, config),
                               hf_config, family, inputs["token_ids"])
    assert np.abs(expected - without_lora).max() > 1e-3  # the adapters change the logits
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)


# -- Hugging Face checkpoints: RoBERTa import, BERT round trip -------------------------------


def test_roberta_checkpoint_imports_to_the_same_model(tmp_path):
    source = _backbone("roberta")
    _randomize(source.weights, np.random.default_rng(3), 0.3)
    hf_weights.save_hf_checkpoint(source, tmp_path)
    loaded, tokenizer = hf_weights.load_hf_roberta(tmp_path)
    assert tokenizer is None  # no vocab.json / merges.txt written
    np.testing.assert_array_equal(loaded.token_embedding.embeddings.numpy(),
                                  source.token_embedding.embeddings.numpy())
    inputs = _inputs("roberta")
    np.testing.assert_allclose(loaded(inputs).numpy(), source(inputs).numpy(), atol=1e-5, rtol=0)


def test_roberta_token_type_row_is_folded_into_positions(tmp_path):
    source = _backbone("roberta")
    _randomize(source.weights, np.random.default_rng(4), 0.3)
    tensors = hf_weights.to_hf_tensors(source)
    v = np.random.default_rng(5).normal(size=(1, 8)).astype(np.float32)
    tensors["roberta.embeddings.token_type_embeddings.weight"] = v
    tensors["roberta.embeddings.position_embeddings.weight"][2:] -= v
    loaded = _backbone("roberta")
    hf_weights.assign_hf_tensors(loaded, tensors)
    inputs = _inputs("roberta")
    np.testing.assert_allclose(loaded(inputs).numpy(), source(inputs).numpy(), atol=1e-5, rtol=0)


def test_roberta_forward_matches_numpy_hf(tmp_path):
    source = _backbone("roberta")
    _randomize(source.weights, np.random.default_rng(6), 0.3)
    hf_weights.save_hf_checkpoint(source, tmp_path)
    loaded, _ = hf_weights.load_hf_roberta(tmp_path)
    t = {k: v.astype(np.float64) for k, v in
         safetensors.numpy.load_file(str(tmp_path / "model.safetensors")).items()}
    cfg = json.loads((tmp_path / "config.json").read_text())
    # A head to read the whole sequence through _hf_forward: identity-like dense, zero bias.
    t["classifier.dense.weight"], t["classifier.dense.bias"] = np.eye(8), np.zeros(8)
    t["classifier.out_proj.weight"], t["classifier.out_proj.bias"] = np.eye(8), np.zeros(8)
    inputs = _inputs("roberta")
    expected = _hf_forward(t, cfg, "roberta", inputs["token_ids"])
    ours = np.tanh(loaded(inputs).numpy()[:, 0])
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)


def test_bert_checkpoint_round_trips_through_load_hf_bert(tmp_path):
    source = _backbone("bert")
    _randomize(source.weights, np.random.default_rng(7), 0.3)
    hf_weights.save_hf_checkpoint(source, tmp_path)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    loaded, _ = hf_bert.load_hf_bert(tmp_path)
    inputs = _inputs("bert")
    out, ref = loaded(inputs), source(inputs)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(out[key].numpy(), ref[key].numpy(), atol=1e-5, rtol=0)
