"""LoRA adapters of a KerasNLP BERT / RoBERTa classifier or of a Gemma 3 decoder LM in Hugging
Face PEFT's LoRA format, both ways.

A PEFT LoRA folder holds `adapter_config.json` and `adapter_model.safetensors`. For a target
module at HF path P (e.g. `roberta.encoder.layer.3.attention.self.query`, or
`model.layers.14.self_attn.q_proj` in Gemma3ForCausalLM; `models.peft_names`) the file holds

    base_model.model.P.lora_A.weight   (r, in_features)
    base_model.model.P.lora_B.weight   (out_features, r)

and PEFT computes y = x·Wᵀ + b + (lora_alpha / r)·x·Aᵀ·Bᵀ (torch's (out, in) weights). Our
`models.lora_layers.LoraLayer` computes y = x·W0 + b + (α/r)·x·A·B with A (d_in, r), B (r, d_out)
and the EinsumDense axes flattened row-major, which is HF's feature order (heads × head_dim), so

    lora_A.weight = Aᵀ,  lora_B.weight = Bᵀ,  r = rank,  lora_alpha = α.

Targets (`models.lora_targets.ALL_TARGETS`) map to HF modules as `models.peft_names` says for
the model's family (`bert`, `roberta`: task type SEQ_CLS; `gemma3`: CAUSAL_LM, the adapters of
google/gemma-3-270m's modules, no head); a wrapper's layer index and target are read off its name
`transformer_layer_<i>_<target>_lora` (what `apply_lora` names it), so a prefix-cached suffix
model exports the same way as the whole one.

The trained classifier head is exported as PEFT's `modules_to_save` (saved without PEFT's
`modules_to_save.default` infix, as PEFT itself saves them): a linear head as `classifier`
(`base_model.model.classifier.{weight,bias}`, BertForSequenceClassification's name), a
dense_tanh head as `classifier.dense` + `classifier.out_proj` (RobertaForSequenceClassification's
head), a trained BERT pooler as `<family>.pooler.dense`. HF's sequence classifiers read the CLS
token (BERT through its pooler): only pooling="pooler" + head="linear" on BERT and
pooling="cls" + head="dense_tanh" on RoBERTa are the same function in HF. `tffl_head.json`
records the pooling, head and whether HF computes the same thing (`hf_equivalent`).
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import safetensors.numpy
import tensorflow as tf

from models import peft_names
from models.lora_targets import ALL_TARGETS, lora_layers
from models.peft_names import PREFIX, module_path
from tffl.engine import roles

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
HEAD_FILE = "tffl_head.json"
_WRAPPER = re.compile(r"^transformer_layer_(\d+)_(" + "|".join(ALL_TARGETS) + r")_lora$")
HF_EQUIVALENT = {("bert", "pooler", "linear"): "BertForSequenceClassification",
                 ("roberta", "cls", "dense_tanh"): "RobertaForSequenceClassification"}


def adapter_sites(model: tf.keras.Model) -> list[tuple[int, str, tf.keras.layers.Layer]]:
    """(transformer layer index, target, LoRA wrapper) for every adapter of `model`."""
    sites = []
    for wrapper in lora_layers(model):
        match = _WRAPPER.match(wrapper.name)
        if match is None:
            raise ValueError(f"LoRA wrapper {wrapper.name!r} is not named "
                             "transformer_layer_<i>_<target>_lora (models.lora_targets.apply_lora)")
        sites.append((int(match.group(1)), match.group(2), wrapper))
    if not sites:
        raise ValueError(f"Model {model.name!r} has no LoRA adapters.")
    return sorted(sites, key=lambda s: (s[0], list(ALL_TARGETS).index(s[1])))


def _find_layer(model: tf.keras.Model, name: str):
    found = [m for m in [model, *model.submodules]
             if isinstance(m, tf.keras.layers.Layer) and m.name == name]
    if len(found) > 1 and any(f is not found[0] for f in found):
        raise ValueError(f"{model.name!r} has several layers named {name!r}.")
    return found[0] if found else None


def head_modules(model: tf.keras.Model, family: str) -> dict[str, tf.keras.layers.Dense]:
    """HF module name -> the trained head's Dense layers (`models.backbones.classifier_head`),
    and BERT's pooler when it trains (role `head`); empty for a model without a head."""
    modules = {}
    head, dense = _find_layer(model, "head"), _find_layer(model, "head_dense")
    if dense is not None:
        modules = {"classifier.dense": dense, "classifier.out_proj": head}
    elif head is not None:
        modules = {"classifier": head}
    pooler = _find_layer(model, "pooled_dense")
    if pooler is not None and pooler.trainable and roles.role_of(pooler.kernel) == roles.HEAD:
        modules[f"{family}.pooler.dense"] = pooler
    return modules


def head_description(model: tf.keras.Model, family: str) -> dict:
    """{"pooling", "head", "num_labels", "hf_equivalent"} of the classifier (None fields when
    `model` has no head)."""
    modules = head_modules(model, family)
    if not modules:
        return {"pooling": None, "head": None, "num_labels": None, "hf_equivalent": None}
    pooling = ("pooler" if f"{family}.pooler.dense" in modules
               else "mean" if _find_layer(model, "mean_pooling") is not None else "cls")
    head = "dense_tanh" if "classifier.dense" in modules else "linear"
    out = modules.get("classifier.out_proj", modules.get("classifier"))
    return {"pooling": pooling, "head": head, "num_labels": int(out.kernel.shape[-1]),
            "hf_equivalent": HF_EQUIVALENT.get((family, pooling, head))}


def _family(model: tf.keras.Model, family: str | None) -> str:
    if family is not None:
        peft_names.modules_of(family)   # ValueError naming the families
        return family
    return peft_names.family_of(model)


def peft_tensors(model: tf.keras.Model, family: str | None = None) -> dict[str, np.ndarray]:
    """The PEFT state dict of `model`'s adapters and trained head (float32, contiguous)."""
    family = _family(model, family)
    tensors = {}
    for layer, target, wrapper in adapter_sites(model):
        path = PREFIX + module_path(family, layer, target)
        tensors[f"{path}.lora_A.weight"] = wrapper.lora_a.numpy().T
        tensors[f"{path}.lora_B.weight"] = wrapper.lora_b.numpy().T
    for name, dense in head_modules(model, family).items():
        tensors[f"{PREFIX}{name}.weight"] = dense.kernel.numpy().T
        tensors[f"{PREFIX}{name}.bias"] = dense.bias.numpy()
    return {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}


def peft_config(model: tf.keras.Model, base_model_name_or_path: str | None = None,
                family: str | None = None, task_type: str | None = None) -> dict:
    """`adapter_config.json` for `model`'s adapters (one rank and α for all: PEFT's r and
    lora_alpha; a `ValueError` otherwise); `task_type` defaults to the family's
    (`peft_names.TASK_TYPES`)."""
    family = _family(model, family)
    task_type = task_type or peft_names.TASK_TYPES[family]
    sites = adapter_sites(model)
    ranks = {w.rank for _, _, w in sites}
    alphas = {w.alpha for _, _, w in sites}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(f"Adapters have ranks {sorted(ranks)} and alphas {sorted(alphas)}; "
                         "the export supports one rank and one alpha.")
    if any(w.merged for _, _, w in sites):
        raise ValueError("Adapters are merged into their kernels; unmerge_lora first.")
    target_modules = peft_names.target_modules(family, [(i, t) for i, t, _ in sites],
                                               peft_names.num_layers(model))
    heads = head_modules(model, family)
    modules_to_save = (["classifier"] if any(n.startswith("classifier") for n in heads) else [])
    modules_to_save += ["pooler"] if f"{family}.pooler.dense" in heads else []
    return {
        "peft_type": "LORA", "task_type": task_type, "r": ranks.pop(), "lora_alpha": alphas.pop(),
        "target_modules": target_modules, "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": False, "modules_to_save": modules_to_save or None,
        "base_model_name_or_path": base_model_name_or_path, "inference_mode": True,
        "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
        "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": False, "use_dora": False,
        "revision": None,
    }


def _has_backbone(model) -> bool:
    return peft_names.num_layers(model) is not None


def export_peft(model: tf.keras.Model, output_dir: str | pathlib.Path,
                base_model_name_or_path: str | None = None, family: str | None = None,
                task_type: str | None = None) -> pathlib.Path:
    """Writes `adapter_model.safetensors`, `adapter_config.json` and `tffl_head.json` of
    `model` (a KerasNLP BERT / RoBERTa classifier or a Gemma 3 decoder LM with `apply_lora`
    adapters) into `output_dir`; `task_type` defaults to the family's."""
    family = _family(model, family)
    config = peft_config(model, base_model_name_or_path, family, task_type)
    tensors = peft_tensors(model, family)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(output_dir / ADAPTER_WEIGHTS),
                                metadata={"format": "pt"})
    (output_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    head = head_description(model, family) | {"family": family}
    (output_dir / HEAD_FILE).write_text(json.dumps(head, indent=2, sort_keys=True))
    return output_dir


def read_peft(folder: str | pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """`(adapter_config, tensors)` of a PEFT LoRA folder."""
    folder = pathlib.Path(folder)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{folder}: peft_type {config.get('peft_type')!r} is not LORA.")
    for key, wanted in (("fan_in_fan_out", False), ("use_dora", False), ("use_rslora", False)):
        if config.get(key, wanted) != wanted:
            raise ValueError(f"{folder}: {key}={config[key]!r} is not supported.")
    return config, safetensors.numpy.load_file(str(folder / ADAPTER_WEIGHTS))


def _planned_assignments(model, family, config, tensors) -> list[tuple[tf.Variable, np.ndarray]]:
    scale = config["lora_alpha"] / config["r"]
    plan, used = [], set()

    def take(key, variable, value_fn):
        if key not in tensors:
            raise ValueError(f"Adapter file has no tensor {key!r}.")
        value = value_fn(tensors[key])
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{key}: file {tensors[key].shape} does not fit the model's "
                             f"{tuple(variable.shape)} (transposed).")
        plan.append((variable, value))
        used.add(key)

    for layer, target, wrapper in adapter_sites(model):
        path = PREFIX + module_path(family, layer, target)
        # Same ΔW = scale·A·B whatever α the file was trained with (factor 1.0 when equal).
        factor = np.float32(scale / wrapper.scale)
        take(f"{path}.lora_A.weight", wrapper.lora_a, lambda t: t.T)
        take(f"{path}.lora_B.weight", wrapper.lora_b, lambda t, f=factor: t.T * f)
    for name, dense in head_modules(model, family).items():
        if f"{PREFIX}{name}.weight" in tensors:
            take(f"{PREFIX}{name}.weight", dense.kernel, lambda t: t.T)
            take(f"{PREFIX}{name}.bias", dense.bias, lambda t: t)
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"Adapter tensors the model has no place for: {unused[:5]}")
    return plan


def import_peft(model: tf.keras.Model, folder: str | pathlib.Path,
                family: str | None = None) -> None:
    """Assigns a PEFT LoRA folder's adapters (and head, when the file has it) to `model`, whose
    adapters must sit where the file's are (same layers, targets and rank). Nothing is assigned
    when anything does not fit (`ValueError`)."""
    family = _family(model, family)
    config, tensors = read_peft(folder)
    sites = adapter_sites(model)
    if any(w.merged for _, _, w in sites):
        raise ValueError("Adapters are merged into their kernels; unmerge_lora first.")
    for variable, value in _planned_assignments(model, family, config, tensors):
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))


# -- starting a run from an exported folder ---------------------------------------------------

def _folder_sites(tensors: dict) -> tuple[set[str], set[tuple[int, str]]]:
    """(families, {(layer, target)}) of the adapters in a PEFT state dict."""
    families, sites = set(), set()
    for key in tensors:
        parsed = peft_names.parse_lora_key(key)
        if parsed:
            families.add(parsed[0])
            sites.add(parsed[1:])
    return families, sites


def _sites_text(sites) -> str:
    targets = sorted({t for _, t in sites}, key=list(ALL_TARGETS).index)
    layers = sorted({i for i, _ in sites})
    return f"{','.join(targets)} of layers {','.join(map(str, layers))}"


def _check_folder(model, where: str, config: dict, tensors: dict, family: str | None) -> str:
    """The family of the folder's adapters, after checking rank and adapted modules against
    `model`'s (ValueError naming the flag that differs)."""
    families, folder_sites = _folder_sites(tensors)
    if len(families) != 1:
        raise ValueError(f"{where}: no LoRA adapters of one {'/'.join(peft_names.FAMILIES)} "
                         f"model in {ADAPTER_WEIGHTS} (found {sorted(tensors)[:3]})")
    found = families.pop()
    family = family or (peft_names.family_of(model) if _has_backbone(model) else found)
    if found != family:
        raise ValueError(f"{where}: its adapters are a {found} model's, this run's model is "
                         f"{family}: set `backbone` as in the run that exported it")
    sites = adapter_sites(model)
    ranks = sorted({w.rank for _, _, w in sites})
    if ranks != [config["r"]]:
        raise ValueError(f"{where}: its adapters have rank {config['r']}, this run's "
                         f"{'/'.join(map(str, ranks))}: set rank={config['r']}")
    model_sites = {(i, t) for i, t, _ in sites}
    if folder_sites != model_sites:
        mismatch = sorted(folder_sites ^ model_sites)[0]
        path = module_path(family, *mismatch)
        whose = "the folder's" if mismatch in folder_sites else "this run's"
        raise ValueError(
            f"{where}: it adapts {_sites_text(folder_sites)}, this run "
            f"{_sites_text(model_sites)} (e.g. {path} is only {whose}): set `lora_targets` and "
            "`lora_layers` as in the run that exported it")
    heads = {f"{PREFIX}{n}.weight" for n in head_modules(model, family)}
    for key in sorted(k for k in tensors if not peft_names.parse_lora_key(k)
                      and not k.endswith(".lora_B.weight")):
        if key.endswith(".weight") and key not in heads:
            raise ValueError(f"{where}: it holds a trained {key[len(PREFIX):-len('.weight')]} "
                             "that this run's model lacks: set `head` and `pooling` as its "
                             f"{HEAD_FILE} says")
    return family


def init_adapters(model: tf.keras.Model, folder: str | pathlib.Path,
                  family: str | None = None) -> list[str]:
    """Sets `model`'s LoRA adapters, and its head when the folder holds one (PEFT's
    `modules_to_save`), from a folder `export_peft` wrote (`adapter_model.safetensors` +
    `adapter_config.json`), so a run starts from them; returns the names of the variables set.

    The folder must fit the model: the same rank (`rank`), adapted modules (`lora_targets`,
    `lora_layers`), backbone (`backbone`), and head (`head`, `pooling`, the task's
    labels); otherwise a one-line ValueError starting `init_adapters=<folder>:` names what
    differs and the flag to change, and nothing is set. A different α is rescaled so that
    ΔW = (α/r)·A·B is the folder's (`import_peft`). `family` ("bert" / "roberta") defaults to
    the model's backbone, or to the folder's for a model without one (a prefix-cached suffix).

    >>> export_peft(trained, run_dir / "adapters")  # doctest: +SKIP
    >>> names = init_adapters(fresh, run_dir / "adapters")  # doctest: +SKIP
    >>> names[:2]  # doctest: +SKIP
    ['transformer_layer_0_query_lora/lora_a:0', 'transformer_layer_0_query_lora/lora_b:0']
    """
    folder = pathlib.Path(folder)
    where = f"init_adapters={folder}"
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            raise ValueError(f"{where}: no {name} there (a folder written by "
                             "scripts/export_adapters.py or models.peft_export.export_peft)")
    try:
        config, tensors = read_peft(folder)
        family = _check_folder(model, where, config, tensors, family)
        plan = _planned_assignments(model, family, config, tensors)
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith(where) else
                         f"{where}: {message.rstrip('.')}: set `backbone`, `head` and `pooling` "
                         "as in the run that exported it, and its `task`") from None
    import_peft(model, folder, family)
    return [variable.name for variable, _ in plan]


def initial_weights_with_adapters(keras_model_fn, input_spec, folder: str | pathlib.Path,
                                  initial_non_trainable=None, family: str | None = None
                                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """`(trainable, non_trainable, names)`: a process's starting weights with the adapters (and
    head) of a PEFT `folder` (`init_adapters`), for a process builder's `initial_trainable=` and
    `initial_non_trainable=`. The model's own initial values are drawn once
    (`tffl.engine.frozen.initial_values`, what the builder would draw); `initial_non_trainable`
    (e.g. a pretrained backbone) replaces the drawn non-trainable ones."""
    from tffl.engine import client_training
    from tffl.engine import frozen as frozen_lib

    trainable, non_trainable = frozen_lib.initial_values(keras_model_fn, input_spec)
    if initial_non_trainable is not None:
        non_trainable = [np.asarray(v) for v in initial_non_trainable]
    model = client_training.build_model(keras_model_fn, input_spec, zero_init=True)
    for variable, value in zip(model.trainable_variables + model.non_trainable_variables,
                               trainable + non_trainable, strict=True):
        variable.assign(value)
    names = init_adapters(model, folder, family)
    return [v.numpy() for v in model.trainable_variables], non_trainable, names
