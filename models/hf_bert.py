"""Loading a Hugging Face BERT-family checkpoint into KerasNLP `BertBackbone` + `BertTokenizer`.

Input: a folder with `model.safetensors`, `config.json` and `vocab.txt` (HF layout; weight names
with or without a `bert.` prefix). HF `nn.Linear` stores weight (d_out, d_in) and computes
x·Wᵀ + b, so every Keras kernel is the transpose, reshaped for the attention projections:

| HF tensor (layer i)                    | KerasNLP variable                                  |
|----------------------------------------|----------------------------------------------------|
| embeddings.{word,position,token_type}  | token / position / segment embedding               |
| embeddings.LayerNorm                   | embeddings_layer_norm (gamma, beta)                |
| attention.self.{query,key,value}       | `_{q,k,v}_dense`: kernel Wᵀ→(h, heads, h/heads),   |
|                                        | bias → (heads, h/heads)                            |
| attention.output.dense                 | `_output_dense`: kernel Wᵀ→(heads, h/heads, h)     |
| attention.output.LayerNorm             | `_self_attention_layer_norm`                       |
| intermediate.dense, output.dense       | `_feedforward_{intermediate,output}_dense` (Wᵀ)    |
| output.LayerNorm                       | `_feedforward_layer_norm`                          |
| pooler.dense                           | `pooled_dense` (Wᵀ)                                |

Activation: KerasNLP's `BertBackbone` hard-codes the tanh approximation of GELU, while HF's
`hidden_act="gelu"` is the exact erf GELU; `load_hf_bert` switches the feed-forward activation to
the one `config.json` names (`gelu` → exact, `gelu_new`/`gelu_pytorch_tanh` → tanh approximation).
That switch lives on the layer objects; `BertBackbone.get_config()` does not record it.
"""

import json
import pathlib

import keras_nlp
import numpy as np
import tensorflow as tf
from safetensors.numpy import load_file

from models.checkpoints import fetch_minilm


def _gelu_exact(x):
    return tf.keras.activations.gelu(x, approximate=False)


def _gelu_tanh(x):
    return tf.keras.activations.gelu(x, approximate=True)


_ACTIVATIONS = {
    "gelu": _gelu_exact,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": tf.keras.activations.relu,
}


def set_feedforward_activation(backbone: tf.keras.Model, hidden_act: str) -> None:
    """Sets every transformer layer's feed-forward activation to HF's `hidden_act`."""
    if hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"Unsupported hidden_act={hidden_act!r}; expected one of {', '.join(_ACTIVATIONS)}."
        )
    fn = _ACTIVATIONS[hidden_act]
    for layer in backbone.transformer_layers:
        layer.activation = fn
        dense = layer._feedforward_intermediate_dense
        dense = getattr(dense, "layer", dense)  # a LoRA wrapper applies the inner activation
        dense.activation = fn


def read_hf_config(folder: pathlib.Path) -> dict:
    """`config.json` of a BERT-family checkpoint, checked for what `BertBackbone` supports."""
    config = json.loads((pathlib.Path(folder) / "config.json").read_text())
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("Only absolute position embeddings are supported.")
    if config.get("layer_norm_eps", 1e-12) != 1e-12:
        raise ValueError(f"BertBackbone uses layer_norm_eps=1e-12, got {config['layer_norm_eps']}.")
    return config


def _assign(variable: tf.Variable, value: np.ndarray, name: str) -> None:
    value = np.asarray(value, dtype=np.float32)
    if tuple(variable.shape) != value.shape:
        raise ValueError(
            f"Checkpoint tensor {name!r} has shape {value.shape}, expected {tuple(variable.shape)}."
        )
    variable.assign(value)


def convert_hf_bert_weights(
    backbone: keras_nlp.models.BertBackbone, tensors: dict[str, np.ndarray], num_heads: int
) -> None:
    """Assigns HF BERT `tensors` (name → array) to a matching `backbone` (see module table)."""
    t = {k.removeprefix("bert."): v for k, v in tensors.items()}
    used = set()

    def get(name):
        if name not in t:
            raise ValueError(f"Checkpoint has no tensor {name!r}.")
        used.add(name)
        return t[name]

    hidden = backbone.hidden_dim
    head_dim = hidden // num_heads
    _assign(backbone.token_embedding.embeddings, get("embeddings.word_embeddings.weight"),
            "embeddings.word_embeddings.weight")
    positions = get("embeddings.position_embeddings.weight")
    _assign(backbone.position_embedding.position_embeddings, positions,
            "embeddings.position_embeddings.weight")
    _assign(backbone.segment_embedding.embeddings, get("embeddings.token_type_embeddings.weight"),
            "embeddings.token_type_embeddings.weight")
    _assign(backbone.embeddings_layer_norm.gamma, get("embeddings.LayerNorm.weight"), "LN")
    _assign(backbone.embeddings_layer_norm.beta, get("embeddings.LayerNorm.bias"), "LN")

    def base(layer):
        return getattr(layer, "layer", layer)  # unwrap a LoRA wrapper

    for i, enc in enumerate(backbone.transformer_layers):
        p = f"encoder.layer.{i}."
        attn = enc._self_attention_layer
        for hf, dense in (("query", attn._query_dense), ("key", attn._key_dense),
                          ("value", attn._value_dense)):
            name = f"{p}attention.self.{hf}"
            w = get(name + ".weight").T.reshape(hidden, num_heads, head_dim)
            _assign(base(dense).kernel, w, name + ".weight")
            _assign(base(dense).bias, get(name + ".bias").reshape(num_heads, head_dim),
                    name + ".bias")
        name = f"{p}attention.output.dense"
        _assign(base(attn._output_dense).kernel,
                get(name + ".weight").T.reshape(num_heads, head_dim, hidden), name + ".weight")
        _assign(base(attn._output_dense).bias, get(name + ".bias"), name + ".bias")
        for hf, ln in (("attention.output.LayerNorm", enc._self_attention_layer_norm),
                       ("output.LayerNorm", enc._feedforward_layer_norm)):
            _assign(ln.gamma, get(f"{p}{hf}.weight"), f"{p}{hf}.weight")
            _assign(ln.beta, get(f"{p}{hf}.bias"), f"{p}{hf}.bias")
        for hf, dense in (("intermediate.dense", enc._feedforward_intermediate_dense),
                          ("output.dense", enc._feedforward_output_dense)):
            _assign(base(dense).kernel, get(f"{p}{hf}.weight").T, f"{p}{hf}.weight")
            _assign(base(dense).bias, get(f"{p}{hf}.bias"), f"{p}{hf}.bias")
    if "pooler.dense.weight" in t:
        _assign(backbone.pooled_dense.kernel, get("pooler.dense.weight").T, "pooler.dense.weight")
        _assign(backbone.pooled_dense.bias, get("pooler.dense.bias"), "pooler.dense.bias")
    ignored = {"embeddings.position_ids"}
    unused = sorted(set(t) - used - ignored)
    if unused:
        raise ValueError(f"Checkpoint tensors not used by BertBackbone: {unused[:5]} ...")


def bert_backbone_from_config(config: dict, dropout: float = 0.0) -> keras_nlp.models.BertBackbone:
    """The `BertBackbone` architecture of a HF BERT `config` (`read_hf_config`), randomly
    initialized, with the checkpoint's feed-forward activation (exact GELU for BERT).

    Used where weights must come later, e.g. inside a TFF computation, whose models are built in
    a graph: build the architecture there and load the weights eagerly with `load_hf_bert`.

    Example:

    >>> backbone = bert_backbone_from_config(read_hf_config(fetch_minilm()))
    >>> backbone.num_layers
    6
    """
    backbone = keras_nlp.models.BertBackbone(
        vocabulary_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        dropout=dropout,
        max_sequence_length=config["max_position_embeddings"],
        num_segments=config["type_vocab_size"],
    )
    set_feedforward_activation(backbone, config.get("hidden_act", "gelu"))
    return backbone


def load_hf_bert(
    folder: str | pathlib.Path, dropout: float = 0.0
) -> tuple[keras_nlp.models.BertBackbone, keras_nlp.models.BertTokenizer]:
    """A KerasNLP `BertBackbone` with the HF checkpoint's weights, and its `BertTokenizer`.

    Args:
      folder: contains `model.safetensors`, `config.json`, `vocab.txt`.
      dropout: the backbone's dropout rate (HF's 0.1 only matters in training).

    Example:

    >>> backbone, tokenizer = load_hf_bert(fetch_minilm())
    >>> packer = keras_nlp.models.BertPreprocessor(tokenizer, sequence_length=16)
    >>> backbone(packer(["Hello world."]))["sequence_output"].shape
    TensorShape([1, 16, 384])
    """
    folder = pathlib.Path(folder)
    config = read_hf_config(folder)
    backbone = bert_backbone_from_config(config, dropout)
    convert_hf_bert_weights(
        backbone, load_file(str(folder / "model.safetensors")), config["num_attention_heads"]
    )
    tokenizer = load_hf_bert_tokenizer(folder, lowercase=config.get("do_lower_case", True))
    return backbone, tokenizer


def load_hf_bert_tokenizer(
    folder: str | pathlib.Path, lowercase: bool = True
) -> keras_nlp.models.BertTokenizer:
    """KerasNLP `BertTokenizer` over `vocab.txt`, matching HF's uncased BERT normalization
    (lowercase and strip accents).

    Example:

    >>> tokenizer = load_hf_bert_tokenizer(fetch_minilm())
    >>> tokenizer.cls_token_id, tokenizer.sep_token_id
    (101, 102)
    """
    vocab_path = pathlib.Path(folder) / "vocab.txt"
    vocabulary = vocab_path.read_text(encoding="utf-8").splitlines()
    return keras_nlp.models.BertTokenizer(
        vocabulary=vocabulary, lowercase=lowercase, strip_accents=lowercase
    )


def load_minilm(dropout: float = 0.0):
    """`load_hf_bert(fetch_minilm())`: all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads)."""
    return load_hf_bert(fetch_minilm(), dropout=dropout)
