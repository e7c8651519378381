"""Whole-model LoRA utilities: merge / unmerge, adapter-only save / load, parameter counts.

Adapter files hold only the LoRA factors, keyed `"<wrapper name>/lora_a"` and
`"<wrapper name>/lora_b"` (wrapper names are unique per model; `apply_lora` names them
`transformer_layer_<i>_<target>_lora`). The format follows the suffix: `.npz` (numpy) or
`.safetensors`.
"""

import pathlib

import numpy as np
import safetensors.numpy
import tensorflow as tf

from models.lora_targets import lora_layers


def merge_lora(model: tf.keras.Model) -> int:
    """Folds every adapter into its frozen kernel (W0 ← W0 + (α/r)·A·B); returns the count.

    Example:

    >>> from models.backbones import build_bert_backbone
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> backbone = build_bert_backbone(vocabulary_size=50)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2))   # query and value of both layers
    >>> merge_lora(backbone)
    4
    """
    layers = lora_layers(model)
    for layer in layers:
        layer.merge()
    return len(layers)


def unmerge_lora(model: tf.keras.Model) -> int:
    """Undoes `merge_lora` (W0 ← W0 − (α/r)·A·B); returns the number of adapters."""
    layers = lora_layers(model)
    for layer in layers:
        layer.unmerge()
    return len(layers)


def adapter_state(model: tf.keras.Model) -> dict[str, np.ndarray]:
    """{"<wrapper>/lora_a": A, "<wrapper>/lora_b": B} for every adapter of `model`."""
    state = {}
    for layer in lora_layers(model):
        state[f"{layer.name}/lora_a"] = layer.lora_a.numpy()
        state[f"{layer.name}/lora_b"] = layer.lora_b.numpy()
    return state


def lora_parameter_count(model: tf.keras.Model) -> int:
    """Σ over adapters of r·(d_in + d_out).

    Example:

    >>> from models.backbones import build_bert_backbone
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> backbone = build_bert_backbone(vocabulary_size=50, hidden_dim=32)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2, targets=("value",), layers=(0,)))
    >>> lora_parameter_count(backbone)  # 2 * (32 + 32)
    128
    """
    return sum(layer.rank * (layer.d_in + layer.d_out) for layer in lora_layers(model))


def save_adapters(model: tf.keras.Model, path: str | pathlib.Path) -> pathlib.Path:
    """Writes only the LoRA factors of `model` to `path` (`.npz` or `.safetensors`).

    Example:

    >>> from models.backbones import build_bert_backbone
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> backbone = build_bert_backbone(vocabulary_size=50)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2, targets=("value",), layers=(0,)))
    >>> path = save_adapters(backbone, run_dir / "adapters.npz")
    >>> sorted(np.load(path))
    ['transformer_layer_0_value_lora/lora_a', 'transformer_layer_0_value_lora/lora_b']
    """
    path = pathlib.Path(path)
    state = adapter_state(model)
    if not state:
        raise ValueError(f"Model {model.name!r} has no LoRA adapters to save.")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npz":
        with open(path, "wb") as f:
            np.savez(f, **state)
    elif path.suffix == ".safetensors":
        safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
                                    str(path))
    else:
        raise ValueError(f"Adapter file must end in .npz or .safetensors, got {path.name!r}.")
    return path


def _read(path: pathlib.Path) -> dict[str, np.ndarray]:
    if path.suffix == ".npz":
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    if path.suffix == ".safetensors":
        return safetensors.numpy.load_file(str(path))
    raise ValueError(f"Adapter file must end in .npz or .safetensors, got {path.name!r}.")


def load_adapters(model: tf.keras.Model, path: str | pathlib.Path) -> None:
    """Assigns the LoRA factors stored in `path` to `model`'s adapters.

    The file's names must equal the model's adapter names exactly and every shape must match;
    otherwise a `ValueError` lists the missing / unexpected names or the mismatched shapes, and
    nothing is assigned. Merged adapters are unmerged first and re-merged after loading.
    """
    path = pathlib.Path(path)
    stored = _read(path)
    layers = {layer.name: layer for layer in lora_layers(model)}
    expected = {}
    for name, layer in layers.items():
        expected[f"{name}/lora_a"] = layer.lora_a
        expected[f"{name}/lora_b"] = layer.lora_b
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"Adapter file {path.name} does not match the model: missing {missing}, "
            f"unexpected {unexpected}."
        )
    bad = [
        f"{k}: file {tuple(stored[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if tuple(stored[k].shape) != tuple(v.shape)
    ]
    if bad:
        raise ValueError(f"Adapter file {path.name} has shape mismatches: {'; '.join(bad)}.")
    merged = [layer for layer in layers.values() if layer.merged]
    for layer in merged:
        layer.unmerge()
    for key, variable in expected.items():
        variable.assign(stored[key].astype(variable.dtype.as_numpy_dtype))
    for layer in merged:
        layer.merge()
