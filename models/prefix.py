"""Splitting a transformer classifier at its lowest trained layer: a frozen prefix computed once
per example, and the suffix that clients train.

A classifier built by `models.backbones.build_classifier` over a KerasNLP BERT/RoBERTa backbone
computes

    h_0 = Dropout(LayerNorm(embed(x)))      h_{i+1} = Encoder_i(h_i, mask)      (i = 0..L-1)
    logits = head(pool(h_L, mask))          (`backbones.pool`: mean, cls or pooler)

When every trainable variable (LoRA factors, head) lives in encoders k..L-1 or above, and the
prefix has no active dropout, h_k is a fixed function of the example: it never changes during
training. `build_prefix_model(backbone, k)` maps the backbone's inputs to
`{"hidden": h_k (batch, seq, hidden), "padding_mask": (batch, seq)}`, and the suffix classifier
(`SuffixSpec.build_classifier`) maps those to the same logits while building only encoders
k..L-1, the pooling and the head: the embeddings (30,522 × 384 floats at MiniLM) and encoders
0..k-1 are never created in a client's graph. Padded positions of h_k are masked out of every
attention and of the mean pooling and never reach position 0, so the suffix gives each example
the same logits whatever its padding.

Layers keep their names (`transformer_layer_3`, `pooled_dense`, `head_dense`, `head`), so
weights move between
the whole classifier and its suffix layer by layer (`matching_variables`, `matching_positions`).

Example:

>>> import numpy as np
>>> from models import backbones, lora_targets
>>> config = lora_targets.LoraConfig(rank=2, targets=("value",), layers=(1,))
>>> backbone = backbones.build_bert_backbone(vocabulary_size=50, num_layers=2)
>>> _ = lora_targets.apply_lora(backbone, config)
>>> model = backbones.build_classifier(backbone, num_classes=2, pooling="mean")
>>> from tffl.engine.feature_cache import stochastic_layers
>>> trained_start_layer(model, stochastic_layers)
1
>>> spec = SuffixSpec.from_backbone(find_backbone(model), start_layer=1, pooling="mean")
>>> suffix = spec.build_classifier(config, num_classes=2)
>>> [v.name for v in suffix.trainable_variables] == [v.name for v in model.trainable_variables]
True
>>> for variable, source in zip(suffix.variables, matching_variables(model, suffix)):
...     _ = variable.assign(source)
>>> batch = backbones.dummy_batch(backbone, seq_len=6)
>>> prefix = build_prefix_model(find_backbone(model), start_layer=1)
>>> bool(np.allclose(model(batch), suffix(prefix(batch)), atol=1e-5))
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from models import backbones as backbones_lib
from models import lora_targets
from tffl.engine import roles

HIDDEN = "hidden"
PADDING_MASK = "padding_mask"


def find_backbone(model: tf.keras.Model) -> tf.keras.Model:
    """The KerasNLP backbone (the layer with `transformer_layers`) inside a classifier."""
    if getattr(model, "transformer_layers", None):
        return model
    for layer in model.layers:
        if getattr(layer, "transformer_layers", None):
            return layer
    raise ValueError(f"model {model.name!r} has no KerasNLP backbone (no layer with "
                     "`transformer_layers`); the frozen-prefix cache needs one")


def trained_start_layer(model: tf.keras.Model,
                        stochastic_layers: Callable[[tf.Module], Sequence[str]]) -> int | None:
    """The lowest encoder index k such that every trainable variable of `model` sits in encoders
    k..L-1 or after the encoders (pooler, head); L if only those train. None when the prefix
    cannot be cached: a trainable embedding variable, or dropout active in the prefix (then h_k
    would be random in training), i.e. a layer below k for which `stochastic_layers(layer)`
    names a layer whose training-mode call is random or updates state (the engine's rule,
    `tffl.engine.feature_cache.stochastic_layers`)."""
    backbone = find_backbone(model)
    encoders = backbone.transformer_layers
    trainable = {id(v) for v in model.trainable_variables}
    start = len(encoders)
    for i, encoder in enumerate(encoders):
        if any(id(v) in trainable for v in encoder.weights):
            start = i
            break
    in_encoders = {id(v) for e in encoders for v in e.weights}
    below_head = {id(v) for v in backbone.weights} - in_encoders - {
        id(v) for layer in _pooler(backbone) for v in layer.weights}
    if trainable & below_head:
        return None
    prefix_layers = [layer for layer in backbone.layers
                     if layer not in encoders and layer not in _pooler(backbone)]
    below = [*prefix_layers, *encoders[:start]]
    if any(stochastic_layers(layer) for layer in below):
        return None
    return start


def _pooler(backbone) -> list[tf.keras.layers.Layer]:
    pooler = getattr(backbone, "pooled_dense", None)
    return [pooler] if pooler is not None else []


def build_prefix_model(backbone: tf.keras.Model, start_layer: int) -> tf.keras.Model:
    """`inputs -> {"hidden": h_k, "padding_mask": mask}` on `backbone`'s own layers (shared
    weights), for k = `start_layer` (0 <= k <= L)."""
    encoders = backbone.transformer_layers
    if not 0 <= start_layer <= len(encoders):
        raise ValueError(f"start_layer={start_layer} is not an encoder index of a backbone with "
                         f"{len(encoders)} layers")
    if start_layer < len(encoders):
        hidden = encoders[start_layer].input
    else:
        hidden = encoders[-1].output
    return tf.keras.Model(
        backbone.input, {HIDDEN: hidden, PADDING_MASK: backbone.input[PADDING_MASK]},
        name=f"{backbone.name}_prefix_{start_layer}")


def _clone(layer: tf.keras.layers.Layer) -> tf.keras.layers.Layer:
    """A new, unbuilt layer of `layer`'s class and config (same name). The activation object is
    carried over (a checkpoint's exact GELU does not round-trip through the config)."""
    config = layer.get_config()
    if "activation" in config and hasattr(layer, "activation"):
        config["activation"] = layer.activation
    return type(layer).from_config(config)


class _Encoders:
    """What `lora_targets.apply_lora` reads of a backbone: named, indexed transformer layers."""

    def __init__(self, name: str, transformer_layers: list):
        self.name = name
        self.transformer_layers = transformer_layers


@dataclasses.dataclass(frozen=True)
class SuffixSpec:
    """What it takes to build encoders k..L-1, the pooler and a head without the prefix."""

    name: str
    start_layer: int
    num_layers: int
    hidden_dim: int
    encoders: tuple[tf.keras.layers.Layer, ...]  # the template's encoders k..L-1 (cloned)
    pooler: tf.keras.layers.Layer | None
    pooling: str = "mean"  # `backbones.POOLINGS`, as the whole classifier pools
    head: str = "linear"   # `backbones.HEADS`

    @classmethod
    def from_backbone(cls, backbone: tf.keras.Model, start_layer: int, pooling: str = "mean",
                      head: str = "linear") -> "SuffixSpec":
        encoders = backbone.transformer_layers
        if not 0 <= start_layer <= len(encoders):
            raise ValueError(f"start_layer={start_layer} is not an encoder index of a backbone "
                             f"with {len(encoders)} layers")
        pooler = _pooler(backbone)
        return cls(backbone.name, start_layer, len(encoders), int(backbone.hidden_dim),
                   tuple(encoders[start_layer:]), pooler[0] if pooler else None, pooling, head)

    def input_spec(self) -> dict[str, tf.TensorSpec]:
        """The suffix's batched input: h_k and the padding mask, any batch and sequence length."""
        return {HIDDEN: tf.TensorSpec([None, None, self.hidden_dim], tf.float32),
                PADDING_MASK: tf.TensorSpec([None, None], tf.int32)}

    def build_classifier(self, lora_config: lora_targets.LoraConfig | None, num_classes: int,
                         dropout: float = 0.0, seed: int = 0,
                         name: str = "classifier_suffix") -> tf.keras.Model:
        """`{"hidden", "padding_mask"} -> logits`: fresh encoders k..L-1 (LoRA applied as
        `lora_config` applies it to the whole backbone), `backbones.pool` and
        `backbones.classifier_head` as `pooling` and `head` say. Encoder weights are frozen and
        tagged `frozen`; the pooler, when pooled through, trains like the head."""
        hidden = tf.keras.Input(shape=(None, self.hidden_dim), dtype="float32", name=HIDDEN)
        mask = tf.keras.Input(shape=(None,), dtype="int32", name=PADDING_MASK)
        encoders = [_clone(layer) for layer in self.encoders]
        x = hidden
        for encoder in encoders:
            x = encoder(x, padding_mask=mask)
        body = tf.keras.Model({HIDDEN: hidden, PADDING_MASK: mask}, x,
                              name=f"{self.name}_suffix")
        if lora_config is not None:
            layers = lora_config.layers
            if layers is not None and min(layers, default=self.start_layer) < self.start_layer:
                raise ValueError(f"LoRA on layers {layers} reaches below the suffix's first "
                                 f"layer {self.start_layer}")
            placeholders = [None] * self.start_layer + encoders
            lora_targets.apply_lora(
                _Encoders(body.name, placeholders),
                dataclasses.replace(
                    lora_config, freeze_base=False,
                    layers=tuple(range(self.start_layer, self.num_layers))
                    if layers is None else layers))
        lora_targets.freeze_non_lora(body)
        sequence = body(body.input)
        pooler = None
        if self.pooling == "pooler":
            if self.pooler is None:
                raise ValueError(f"pooling='pooler': backbone {self.name!r} has no pooler")
            pooler = _clone(self.pooler)
            pooler.trainable = True
        features = backbones_lib.pool(sequence, body.input[PADDING_MASK], self.pooling, pooler)
        if pooler is not None:
            roles.tag_layer(pooler, roles.HEAD)  # built by the call, its variables named in it
        logits = backbones_lib.classifier_head(features, num_classes, dropout, seed,
                                               head=self.head)
        return tf.keras.Model(body.input, logits, name=name)



def _weighted_layers(model: tf.keras.Model) -> dict[str, tf.keras.layers.Layer]:
    """Encoders, pooler and head of a classifier or its suffix, by layer name."""
    found = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if layer.name.startswith("transformer_layer_") or layer.name in (
                "pooled_dense", "head_dense", "head"):
            found.setdefault(layer.name, layer)
    return found


def matching_variables(full: tf.keras.Model, suffix: tf.keras.Model) -> list[tf.Variable]:
    """For each of `suffix.variables`, the variable of the whole classifier `full` it stands for
    (the same layer by name, the same weight by position in it).

    Raises:
      ValueError: the two models do not correspond (a missing layer or another shape).
    """
    full_layers = _weighted_layers(full)
    partner = {}
    for name, layer in _weighted_layers(suffix).items():
        if name not in full_layers:
            raise ValueError(f"layer {name!r} of the suffix is not in {full.name!r}")
        ours, theirs = layer.weights, full_layers[name].weights
        if [v.shape for v in ours] != [v.shape for v in theirs]:
            raise ValueError(f"layer {name!r}: weights {[v.shape for v in ours]} of the suffix "
                             f"do not match {[v.shape for v in theirs]}")
        partner.update({id(a): b for a, b in zip(ours, theirs)})
    missing = [v.name for v in suffix.variables if id(v) not in partner]
    if missing:
        raise ValueError(f"suffix variable {missing[0]!r} has no counterpart in {full.name!r}")
    return [partner[id(v)] for v in suffix.variables]


def matching_positions(full: tf.keras.Model, suffix: tf.keras.Model
                       ) -> tuple[list[int], list[int]]:
    """`(trainable, non_trainable)`: for each of `suffix.trainable_variables` (then
    `non_trainable_variables`), its position in the same list of `full`."""
    partner = dict(zip((id(v) for v in suffix.variables), matching_variables(full, suffix)))
    trainable = {id(v): k for k, v in enumerate(full.trainable_variables)}
    non_trainable = {id(v): k for k, v in enumerate(full.non_trainable_variables)}
    try:
        return ([trainable[id(partner[id(v)])] for v in suffix.trainable_variables],
                [non_trainable[id(partner[id(v)])] for v in suffix.non_trainable_variables])
    except KeyError as error:
        raise ValueError("a trainable variable of the suffix is frozen in the whole model, or "
                         "the reverse") from error
