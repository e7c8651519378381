"""Choosing which projections of a KerasNLP backbone get LoRA, and applying it in place.

A KerasNLP `BertBackbone` / `RobertaBackbone` has `transformer_layers`, each a
`TransformerEncoder` whose projections are reached by attribute. The targets are:

| target             | attribute of `TransformerEncoder`                      | d_in → d_out      |
|--------------------|--------------------------------------------------------|-------------------|
| `query`            | `_self_attention_layer._query_dense` (EinsumDense)     | hidden → hidden   |
| `key`              | `_self_attention_layer._key_dense` (EinsumDense)       | hidden → hidden   |
| `value`            | `_self_attention_layer._value_dense` (EinsumDense)     | hidden → hidden   |
| `attention_output` | `_self_attention_layer._output_dense` (EinsumDense)    | hidden → hidden   |
| `ffn_in`           | `_feedforward_intermediate_dense` (Dense, activation)  | hidden → interm.  |
| `ffn_out`          | `_feedforward_output_dense` (Dense)                    | interm. → hidden  |

`apply_lora` works **in place**: it replaces each targeted attribute by a `LoraDense` /
`LoraEinsumDense` wrapping the original layer. The functional backbone calls its layers again on
every forward pass, so the wrappers are used from then on (eagerly, in `tf.function`, inside a
classifier built on the backbone, before or after `apply_lora`). The backbone's own `get_config`
does not describe the adapters: to rebuild, build the backbone from its config and call
`apply_lora` again with the same `LoraConfig` (which round-trips through `to_dict`/`from_dict`).
With `freeze_base=True` (default) every other backbone weight is made non-trainable and tagged
`frozen`, so the trainable variables are exactly the LoRA factors (r·(d_in + d_out) per matrix).

The decoders of KerasNLP 0.8 name their projections by family (`layer_targets`): GPT-2's
`TransformerDecoder` as the table above; Llama's and Mistral's decoders add the gated MLP's
`ffn_gate` (`_feedforward_gate_dense`; `ffn_in` is their up projection). (KerasNLP 0.8's
`GemmaBackbone` requires Keras 3 and cannot be built on this Keras 2 stack.)
`models.gemma3_backbone.Gemma3Backbone` (Gemma 3, Keras 2) names its projections as Llama's do.
"""

import dataclasses
import tensorflow as tf

from models.lora_layers import LoraLayer, kernel_dims, wrap_with_lora
from tffl.engine import roles

# target name -> (attribute path from the TransformerEncoder)
TARGETS = {
    "query": ("_self_attention_layer", "_query_dense"),
    "key": ("_self_attention_layer", "_key_dense"),
    "value": ("_self_attention_layer", "_value_dense"),
    "attention_output": ("_self_attention_layer", "_output_dense"),
    "ffn_in": ("_feedforward_intermediate_dense",),
    "ffn_out": ("_feedforward_output_dense",),
}
# Llama's and Mistral's decoders: TARGETS plus the gate of their gated MLP.
GATED_TARGETS = {**TARGETS, "ffn_gate": ("_feedforward_gate_dense",)}
ALL_TARGETS = tuple(GATED_TARGETS)

_TASKS = ("sst2", "qnli", "mnli", "qqp", "rte")
_QV = ("query", "value")
# RoLoRA's layer budgets for RoBERTa-Large (24 layers, 0-23); `shared/specs/rolora.md` §3.2.
ROLORA_BUDGETS = {
    "P1": {t: (("value",) if t == "sst2" else _QV, tuple(range(21, 24))) for t in _TASKS},
    "P2": {
        "sst2": (_QV, tuple(range(18, 24))),
        "qnli": (_QV, tuple(range(15, 24))),
        "mnli": (_QV, tuple(range(15, 24))),
        "qqp": (_QV, tuple(range(15, 24))),
        "rte": (_QV, tuple(range(16, 24))),
    },
    "P3": {t: (_QV, tuple(range(0 if t == "sst2" else 12, 24))) for t in _TASKS},
}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Where and how to apply LoRA to a transformer backbone.

    Attributes:
      rank: r > 0 (must also be ≤ min(d_in, d_out) of every targeted matrix).
      alpha: α; the update is scaled by α/r (default α = r).
      targets: names from `ALL_TARGETS` (those of the backbone's family: `layer_targets`).
      layers: transformer layer indices (0-based); None means all layers.
      dropout: dropout rate on the LoRA path.
      seed: base seed; the k-th adapted matrix uses seed + k for A.
      freeze_base: make all non-LoRA backbone weights non-trainable and tag them `frozen`.

    Example:

    >>> LoraConfig(rank=4, targets=("query", "value"), layers=(18, 19)).to_dict()["layers"]
    [18, 19]
    """

    rank: int = 4
    alpha: float | None = None
    targets: tuple[str, ...] = _QV
    layers: tuple[int, ...] | None = None
    dropout: float = 0.0
    seed: int = 0
    freeze_base: bool = True

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"LoRA rank must be a positive integer, got rank={self.rank!r}.")
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        if not self.targets:
            raise ValueError("LoraConfig.targets is empty; name at least one target.")
        for target in self.targets:
            if target not in ALL_TARGETS:
                raise ValueError(
                    f"Unknown LoRA target {target!r}; expected one of {', '.join(ALL_TARGETS)}."
                )
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"Duplicate LoRA targets in {self.targets!r}.")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["targets"] = list(self.targets)
        d["layers"] = None if self.layers is None else list(self.layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LoraConfig":
        return cls(**d)


def rolora_config(task: str, budget: str = "P2", rank: int = 4, **kwargs) -> LoraConfig:
    """The RoLoRA paper's LoRA placement for a GLUE `task` under budget P1/P2/P3.

    Example:

    >>> cfg = rolora_config("sst2", "P2")
    >>> cfg.targets, cfg.layers
    (('query', 'value'), (18, 19, 20, 21, 22, 23))
    """
    if budget not in ROLORA_BUDGETS:
        raise ValueError(f"Unknown RoLoRA budget {budget!r}; expected one of P1, P2, P3.")
    if task not in ROLORA_BUDGETS[budget]:
        raise ValueError(f"Unknown RoLoRA task {task!r}; expected one of {', '.join(_TASKS)}.")
    targets, layers = ROLORA_BUDGETS[budget][task]
    return LoraConfig(rank=rank, targets=targets, layers=layers, **kwargs)


def layer_targets(layer) -> dict[str, tuple[str, ...]]:
    """The target table of a transformer layer's family: `GATED_TARGETS` (Llama, Mistral) or
    `TARGETS` (BERT, RoBERTa, GPT-2)."""
    if hasattr(layer, "_feedforward_gate_dense"):
        return GATED_TARGETS
    return TARGETS


def _resolve(encoder, target: str):
    table = layer_targets(encoder)
    if target not in table:
        raise ValueError(f"{type(encoder).__name__} has no {target!r} projection; its targets "
                         f"are {', '.join(table)}.")
    *path, attr = table[target]
    parent = encoder
    for name in path:
        parent = getattr(parent, name)
    return parent, attr


def apply_lora(backbone: tf.keras.Model, config: LoraConfig) -> dict[str, LoraLayer]:
    """Wraps the targeted projections of `backbone` with LoRA, in place.

    Every check (layer indices, rank ≤ min(d_in, d_out), not already adapted) runs before any
    change, so a bad config raises `ValueError` and leaves the backbone untouched.

    Returns:
      The wrappers keyed `"<transformer layer name>/<target>"`, in layer-then-target order.

    Example:

    >>> import keras_nlp
    >>> backbone = keras_nlp.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2,
    ...                                          hidden_dim=8, intermediate_dim=16)
    >>> adapters = apply_lora(backbone, LoraConfig(rank=2, targets=("value",), layers=(1,)))
    >>> list(adapters)
    ['transformer_layer_1/value']
    """
    encoders = getattr(backbone, "transformer_layers", None)
    if not encoders:
        raise ValueError(f"{backbone.name!r} has no `transformer_layers`; cannot apply LoRA.")
    n = len(encoders)
    indices = tuple(range(n)) if config.layers is None else config.layers
    for i in indices:
        if not 0 <= i < n:
            raise ValueError(f"Transformer layer index {i} does not exist (backbone has {n}).")
    if len(set(indices)) != len(indices):
        raise ValueError(f"Duplicate transformer layer indices in {indices!r}.")

    plan = []
    for i in indices:
        for target in config.targets:
            parent, attr = _resolve(encoders[i], target)
            base = getattr(parent, attr)
            key = f"{encoders[i].name}/{target}"
            if isinstance(base, LoraLayer):
                raise ValueError(f"{key} already has LoRA; apply_lora was called twice.")
            d_in, d_out = kernel_dims(base)
            if config.rank > min(d_in, d_out):
                raise ValueError(
                    f"LoRA rank={config.rank} exceeds min(d_in, d_out)=min({d_in}, {d_out}) "
                    f"for {key}."
                )
            plan.append((key, parent, attr, base))

    adapters = {}
    for k, (key, parent, attr, base) in enumerate(plan):
        wrapper = wrap_with_lora(
            base,
            config.rank,
            alpha=config.alpha,
            dropout=config.dropout,
            seed=config.seed + k,
            name=key.replace("/", "_") + "_lora",
        )
        setattr(parent, attr, wrapper)
        adapters[key] = wrapper

    if config.freeze_base:
        freeze_non_lora(backbone)
    return adapters


def freeze_non_lora(model: tf.keras.Model) -> None:
    """Makes every weight of `model` that is not a LoRA factor or a `head` non-trainable and
    `frozen`.

    Leaf layers are frozen one by one (containers stay trainable so LoRA factors inside them
    remain trainable). A layer whose weights are all tagged `head` (BERT's pooler when a
    classifier trains it, `models.backbones.train_pooler`) stays trainable.
    """
    kept = (roles.LORA_A, roles.LORA_B, roles.HEAD)
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, LoraLayer) or _is_head(layer):
            continue
        children = list(layer._flatten_layers(include_self=False, recursive=False))
        if not children and layer.weights:
            layer.trainable = False
    for variable in model.weights:
        if roles.role_of(variable) not in kept:
            roles.tag(variable, roles.FROZEN)


def _is_head(layer: tf.keras.layers.Layer) -> bool:
    return bool(layer.weights) and layer.trainable and all(
        roles.role_of(v) == roles.HEAD for v in layer.weights)


def lora_layers(model: tf.keras.Model) -> list[LoraLayer]:
    """All LoRA wrappers inside `model` (any nesting), sorted by name; names must be unique."""
    found = {}
    for module in model.submodules:
        if isinstance(module, LoraLayer):
            if module.name in found and found[module.name] is not module:
                raise ValueError(f"Two LoRA layers share the name {module.name!r}.")
            found[module.name] = module
    return [found[name] for name in sorted(found)]

