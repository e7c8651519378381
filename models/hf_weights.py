"""Hugging Face names of a KerasNLP BERT / RoBERTa backbone's weights, both ways; RoBERTa import.

One table (`weight_pairs`) maps every backbone variable to its HF tensor and the reshape between
them; `to_hf_tensors` reads it forwards (a `BertModel` / `RobertaModel` state dict with the
`bert.` / `roberta.` prefix of the `*ForSequenceClassification` models), `assign_hf_tensors`
backwards. HF `nn.Linear` stores weight (d_out, d_in) for y = x·Wᵀ + b, so a Keras kernel is its
transpose, reshaped for the attention projections (EinsumDense kernels (h, heads, h/heads) for
query / key / value, (heads, h/heads, h) for the attention output). LoRA wrappers are looked
through: their frozen base kernels are the model's weights (`models.peft_export` handles A, B).

RoBERTa specifics (HF `RobertaModel`):

- position ids start at padding_idx + 1 = 2, so HF's `position_embeddings` has
  max_sequence_length + 2 rows and KerasNLP's are its rows 2:. Exporting writes zeros in rows 0
  and 1 (HF only reads them at padding positions, whose outputs nobody reads).
- HF adds `token_type_embeddings[0]` (type_vocab_size 1) to every token; KerasNLP's
  `RobertaBackbone` has no segment embedding, so importing folds that row into the position
  embeddings (exact: every position gets it once); exporting writes zeros there.
- `layer_norm_eps` 1e-5 and exact GELU, as KerasNLP's `RobertaBackbone`.

`save_base(model, folder)` writes a classifier's frozen backbone as a HF checkpoint; a suffix
classifier of the frozen-prefix split (`models.prefix`) has no backbone of its own, and its base
is assembled from the prefix model and its encoders (`base_checkpoint_of_parts`).

`load_hf_roberta(folder)` reads a local HF folder (`config.json`, `model.safetensors`, and if
present `vocab.json` + `merges.txt` for the tokenizer). BERT-family checkpoints load with
`models.hf_bert.load_hf_bert`.
"""

from __future__ import annotations

import json
import pathlib
import re

import keras_nlp
import numpy as np
import safetensors.numpy
import tensorflow as tf

from models.hf_bert import set_feedforward_activation

FAMILIES = ("bert", "roberta")
_ROBERTA_POSITION_OFFSET = 2  # HF RoBERTa's padding_idx + 1


def backbone_family(model: tf.keras.Model) -> str:
    """"bert" or "roberta": the KerasNLP backbone class `model` is or contains."""
    for module in [model, *model.submodules]:
        if isinstance(module, keras_nlp.models.RobertaBackbone):
            return "roberta"
        if isinstance(module, keras_nlp.models.BertBackbone):
            return "bert"
    raise ValueError(f"{model.name!r} holds no KerasNLP BertBackbone or RobertaBackbone.")


def find_backbone(model: tf.keras.Model) -> tf.keras.Model:
    """The KerasNLP BERT / RoBERTa backbone inside `model` (or `model` itself)."""
    for module in [model, *model.submodules]:
        if isinstance(module, keras_nlp.models.BertBackbone | keras_nlp.models.RobertaBackbone):
            return module
    raise ValueError(f"{model.name!r} holds no KerasNLP BertBackbone or RobertaBackbone.")


def _base(layer):
    return getattr(layer, "layer", layer)  # looks through a LoRA wrapper


def _linear(heads: int | None, hidden: int, kind: str):
    """(to_keras, to_hf) for an HF Linear weight: kind "in_heads" (q/k/v kernel),
    "out_heads" (attention output kernel), "bias_heads" (q/k/v bias) or "plain"."""
    if kind == "in_heads":
        return (lambda w: w.T.reshape(hidden, heads, hidden // heads),
                lambda k: k.reshape(hidden, -1).T)
    if kind == "out_heads":
        return (lambda w: w.T.reshape(heads, hidden // heads, hidden),
                lambda k: k.reshape(-1, hidden).T)
    if kind == "bias_heads":
        return (lambda b: b.reshape(heads, hidden // heads), lambda b: b.reshape(-1))
    return (lambda w: w.T, lambda k: k.T)


def _same():
    return (lambda x: x, lambda x: x)


def encoder_pairs(encoder, i: int, heads: int, hidden: int) -> list[tuple]:
    """(hf name without the family prefix, keras variable, to_keras, to_hf) of encoder layer i."""
    p, attn = f"encoder.layer.{i}.", encoder._self_attention_layer
    pairs = []
    for hf, dense in (("query", attn._query_dense), ("key", attn._key_dense),
                      ("value", attn._value_dense)):
        pairs.append((f"{p}attention.self.{hf}.weight", _base(dense).kernel,
                      *_linear(heads, hidden, "in_heads")))
        pairs.append((f"{p}attention.self.{hf}.bias", _base(dense).bias,
                      *_linear(heads, hidden, "bias_heads")))
    out = _base(attn._output_dense)
    pairs += [(f"{p}attention.output.dense.weight", out.kernel, *_linear(heads, hidden, "out_heads")),
              (f"{p}attention.output.dense.bias", out.bias, *_same())]
    for hf, ln in (("attention.output.LayerNorm", encoder._self_attention_layer_norm),
                   ("output.LayerNorm", encoder._feedforward_layer_norm)):
        pairs += [(f"{p}{hf}.weight", ln.gamma, *_same()), (f"{p}{hf}.bias", ln.beta, *_same())]
    for hf, dense in (("intermediate.dense", encoder._feedforward_intermediate_dense),
                      ("output.dense", encoder._feedforward_output_dense)):
        pairs += [(f"{p}{hf}.weight", _base(dense).kernel, *_linear(None, hidden, "plain")),
                  (f"{p}{hf}.bias", _base(dense).bias, *_same())]
    return pairs


def _embedding_pairs(backbone, family: str) -> list[tuple]:
    e = "embeddings."
    pairs = [(f"{e}word_embeddings.weight", backbone.token_embedding.embeddings, *_same()),
             (f"{e}LayerNorm.weight", backbone.embeddings_layer_norm.gamma, *_same()),
             (f"{e}LayerNorm.bias", backbone.embeddings_layer_norm.beta, *_same())]
    if family == "bert":
        pairs += [(f"{e}position_embeddings.weight",
                   backbone.position_embedding.position_embeddings, *_same()),
                  (f"{e}token_type_embeddings.weight", backbone.segment_embedding.embeddings,
                   *_same())]
    return pairs  # RoBERTa's positions: `_roberta_positions_*` (they involve two HF tensors)


def weight_pairs(backbone: tf.keras.Model) -> list[tuple]:
    """(HF name with its family prefix, keras variable, to_keras, to_hf) for every weight of
    `backbone` except RoBERTa's position embeddings (see the module docstring)."""
    family = backbone_family(backbone)
    heads = backbone.num_heads
    hidden = backbone.hidden_dim
    pairs = _embedding_pairs(backbone, family)
    for i, encoder in enumerate(backbone.transformer_layers):
        pairs += encoder_pairs(encoder, i, heads, hidden)
    if family == "bert":
        pooler = backbone.pooled_dense
        pairs += [("pooler.dense.weight", pooler.kernel, *_linear(None, hidden, "plain")),
                  ("pooler.dense.bias", pooler.bias, *_same())]
    return [(f"{family}.{name}", *rest) for name, *rest in pairs]


def _roberta_positions(backbone) -> tf.Variable:
    return backbone.embeddings.position_embedding.position_embeddings


def to_hf_tensors(backbone: tf.keras.Model) -> dict[str, np.ndarray]:
    """The backbone's weights as a HF `BertModel` / `RobertaModel` state dict (float32 numpy,
    names prefixed `bert.` / `roberta.`)."""
    tensors = {name: np.ascontiguousarray(to_hf(var.numpy()), np.float32)
               for name, var, _, to_hf in weight_pairs(backbone)}
    if backbone_family(backbone) == "roberta":
        positions = _roberta_positions(backbone).numpy()
        pad = np.zeros((_ROBERTA_POSITION_OFFSET, positions.shape[1]), np.float32)
        tensors["roberta.embeddings.position_embeddings.weight"] = np.concatenate([pad, positions])
        tensors["roberta.embeddings.token_type_embeddings.weight"] = np.zeros(
            (1, positions.shape[1]), np.float32)
    return tensors


def _assign(variable, value: np.ndarray, name: str) -> None:
    value = np.asarray(value, np.float32)
    if tuple(variable.shape) != value.shape:
        raise ValueError(f"Checkpoint tensor {name!r} has shape {value.shape}, expected "
                         f"{tuple(variable.shape)}.")
    variable.assign(value)


def assign_hf_tensors(backbone: tf.keras.Model, tensors: dict[str, np.ndarray]) -> None:
    """Assigns a HF state dict (names with or without the family prefix) to `backbone`; every
    backbone weight must be present, and unused tensors (other than position_ids and a
    RoBERTa pooler, which KerasNLP's RobertaBackbone lacks) raise `ValueError`."""
    family = backbone_family(backbone)
    prefix = f"{family}."
    t = {(k if k.startswith(prefix) else prefix + k): v for k, v in tensors.items()}
    used = set()
    for name, variable, to_keras, _ in weight_pairs(backbone):
        if name not in t:
            raise ValueError(f"Checkpoint has no tensor {name!r}.")
        _assign(variable, to_keras(t[name]), name)
        used.add(name)
    if family == "roberta":
        pos_name = prefix + "embeddings.position_embeddings.weight"
        type_name = prefix + "embeddings.token_type_embeddings.weight"
        positions = t[pos_name][_ROBERTA_POSITION_OFFSET:]
        if type_name in t:
            positions = positions + t[type_name][0]
        _assign(_roberta_positions(backbone), positions, pos_name)
        used |= {pos_name, type_name}
    ignored = {prefix + "embeddings.position_ids", prefix + "pooler.dense.weight",
               prefix + "pooler.dense.bias"} if family == "roberta" else {
               prefix + "embeddings.position_ids"}
    unused = sorted(set(t) - used - ignored)
    if unused:
        raise ValueError(f"Checkpoint tensors not used by the backbone: {unused[:5]} ...")


def hidden_act(backbone: tf.keras.Model) -> str:
    """HF's name of the backbone's feed-forward activation, read off its values: "gelu" (exact,
    RoBERTa's and HF BERT's) or "gelu_new" (the tanh approximation KerasNLP's BERT builds with)."""
    dense = _base(backbone.transformer_layers[0]._feedforward_intermediate_dense)
    x = tf.constant([-2.0, -0.5, 0.7, 1.5])
    y = dense.activation(x).numpy()
    for name, approximate in (("gelu", False), ("gelu_new", True)):
        if np.allclose(y, tf.keras.activations.gelu(x, approximate=approximate).numpy(),
                       rtol=0, atol=1e-7):
            return name
    raise ValueError("The backbone's feed-forward activation is neither exact nor tanh GELU.")


def hf_config(backbone: tf.keras.Model) -> dict:
    """A HF `config.json` describing `backbone`'s architecture (`BertModel` / `RobertaModel`)."""
    family = backbone_family(backbone)
    common = {"hidden_size": backbone.hidden_dim, "num_hidden_layers": backbone.num_layers,
              "num_attention_heads": backbone.num_heads,
              "intermediate_size": backbone.intermediate_dim, "hidden_act": hidden_act(backbone),
              "vocab_size": backbone.vocabulary_size, "position_embedding_type": "absolute",
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if family == "bert":
        return common | {"model_type": "bert", "architectures": ["BertModel"],
                         "max_position_embeddings": backbone.max_sequence_length,
                         "type_vocab_size": backbone.num_segments, "layer_norm_eps": 1e-12,
                         "pad_token_id": 0}
    return common | {"model_type": "roberta", "architectures": ["RobertaModel"],
                     "max_position_embeddings": backbone.max_sequence_length
                     + _ROBERTA_POSITION_OFFSET,
                     "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1,
                     "bos_token_id": 0, "eos_token_id": 2}


def save_hf_checkpoint(backbone: tf.keras.Model, folder: str | pathlib.Path) -> pathlib.Path:
    """Writes `config.json` and `model.safetensors` (HF names) of `backbone` into `folder`."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(backbone), indent=1, sort_keys=True))
    safetensors.numpy.save_file(to_hf_tensors(backbone), str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    return folder


def _named_layers(model: tf.keras.Model) -> dict:
    return {layer.name: layer for layer in model._flatten_layers(include_self=False,
                                                                  recursive=True)}


def base_checkpoint_of_parts(prefix: tf.keras.Model, model: tf.keras.Model
                             ) -> tuple[dict, dict]:
    """`(tensors, config)` of a whole frozen BERT backbone split at encoder k (`models.prefix`),
    as a HF `BertModel`: embeddings and encoders < k from the `prefix` model
    (`models.prefix.build_prefix_model`), encoders >= k (their frozen kernels) and a trained
    pooler from the suffix classifier `model`. A pooler the classifier never reads is written as
    zeros."""
    layers = _named_layers(prefix)
    encoders = {n: v for n, v in (layers | _named_layers(model)).items()
                if re.fullmatch(r"transformer_layer_\d+", n)}
    encoders = [encoders[f"transformer_layer_{i}"] for i in range(len(encoders))]
    token = layers["token_embedding"].embeddings.numpy()
    hidden, heads = token.shape[1], encoders[0].num_heads
    ln = layers["embeddings_layer_norm"]
    tensors = {"embeddings.word_embeddings.weight": token,
               "embeddings.position_embeddings.weight":
                   layers["position_embedding"].position_embeddings.numpy(),
               "embeddings.token_type_embeddings.weight":
                   layers["segment_embedding"].embeddings.numpy(),
               "embeddings.LayerNorm.weight": ln.gamma.numpy(),
               "embeddings.LayerNorm.bias": ln.beta.numpy()}
    for i, encoder in enumerate(encoders):
        for name, variable, _, to_hf in encoder_pairs(encoder, i, heads, hidden):
            tensors[name] = to_hf(variable.numpy())
    pooler = _named_layers(model).get("pooled_dense")
    tensors["pooler.dense.weight"] = (np.zeros((hidden, hidden)) if pooler is None
                                      else pooler.kernel.numpy().T)
    tensors["pooler.dense.bias"] = (np.zeros(hidden) if pooler is None
                                    else pooler.bias.numpy())
    holder = type("Encoders", (), {"transformer_layers": encoders})
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": int(hidden),
              "num_hidden_layers": len(encoders), "num_attention_heads": int(heads),
              "intermediate_size": int(encoders[0].intermediate_dim),
              "hidden_act": hidden_act(holder), "vocab_size": int(token.shape[0]),
              "max_position_embeddings": int(tensors["embeddings.position_embeddings.weight"]
                                             .shape[0]),
              "type_vocab_size": int(tensors["embeddings.token_type_embeddings.weight"].shape[0]),
              "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0}
    return ({f"bert.{k}": np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
            config)


def save_base(model: tf.keras.Model, folder: str | pathlib.Path,
              prefix: tf.keras.Model | None = None) -> pathlib.Path:
    """Writes the frozen backbone of the classifier `model` as a HF checkpoint (`config.json`,
    `model.safetensors`) into `folder`: its own backbone, or for a suffix classifier (no backbone
    in it) the BERT assembled with its `prefix` model (`base_checkpoint_of_parts`)."""
    folder = pathlib.Path(folder)
    try:
        backbone = find_backbone(model)
    except ValueError:
        if prefix is None:
            raise ValueError(f"{model.name!r} holds no backbone and no prefix model was given: "
                             "nothing to assemble the base from") from None
    else:
        return save_hf_checkpoint(backbone, folder)
    tensors, config = base_checkpoint_of_parts(prefix, model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    safetensors.numpy.save_file(tensors, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    return folder


def read_hf_roberta_config(folder: str | pathlib.Path) -> dict:
    """`config.json` of a RoBERTa checkpoint, checked for what `RobertaBackbone` supports."""
    config = json.loads((pathlib.Path(folder) / "config.json").read_text())
    checks = {"position_embedding_type": ("absolute", "absolute"), "layer_norm_eps": (1e-5, 1e-5),
              "type_vocab_size": (1, 1), "pad_token_id": (1, 1)}
    for key, (default, wanted) in checks.items():
        if config.get(key, default) != wanted:
            raise ValueError(f"RobertaBackbone needs {key}={wanted!r}, got {config[key]!r}.")
    return config


def roberta_backbone_from_config(config: dict, dropout: float = 0.0):
    """The `RobertaBackbone` architecture of a HF RoBERTa `config`, randomly initialized."""
    backbone = keras_nlp.models.RobertaBackbone(
        vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"], dropout=dropout,
        max_sequence_length=config["max_position_embeddings"] - _ROBERTA_POSITION_OFFSET)
    set_feedforward_activation(backbone, config.get("hidden_act", "gelu"))
    return backbone


def load_hf_roberta(folder: str | pathlib.Path, dropout: float = 0.0):
    """`(backbone, tokenizer)`: a KerasNLP `RobertaBackbone` with the HF RoBERTa checkpoint's
    weights, and its `RobertaTokenizer` (None when the folder has no vocab.json + merges.txt)."""
    folder = pathlib.Path(folder)
    backbone = roberta_backbone_from_config(read_hf_roberta_config(folder), dropout)
    assign_hf_tensors(backbone, safetensors.numpy.load_file(str(folder / "model.safetensors")))
    tokenizer = None
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tokenizer = keras_nlp.models.RobertaTokenizer(vocabulary=str(folder / "vocab.json"),
                                                      merges=str(folder / "merges.txt"))
    return backbone, tokenizer
