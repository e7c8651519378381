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

An encoder classifier exports in the one of two forms (PEFT task types) that computes its logits
(`export_task_type`):

- SEQ_CLS, when HF's sequence classifier is the same function (`HF_EQUIVALENT`: BERT's
  pooler + a linear head, `BertForSequenceClassification`; RoBERTa's CLS token + the dense_tanh
  head, `RobertaForSequenceClassification`). The adapters are that model's modules
  (`bert.encoder.layer.<i>...`) and the trained head is PEFT's `modules_to_save` (saved without
  PEFT's `modules_to_save.default` infix, as PEFT itself saves them): a linear head as
  `classifier` (`base_model.model.classifier.{weight,bias}`), a dense_tanh head as
  `classifier.dense` + `classifier.out_proj`, a trained BERT pooler as `<family>.pooler.dense`.
- FEATURE_EXTRACTION, for every other pooling and head (the padding-masked mean that
  sentence-transformers checkpoints such as all-MiniLM-L6-v2 were trained with, the CLS token
  with a linear head, ...) and for an encoder without a head. The adapters are the base model's
  modules (HF `BertModel` / `RobertaModel`: `encoder.layer.<i>...`), and the pooling and head are
  sentence-transformers modules beside them (`models.sentence_modules`): `modules.json`,
  `1_Pooling/config.json`, one `<k>_Dense/` per head layer (W (out, in), b, Identity or Tanh;
  a trained pooler is CLS pooling then a Tanh Dense). The logits are

      h = AutoModel(base) + the adapters, last_hidden_state (batch, seq, hidden)
      x = Σ_t m_t h_t / Σ_t m_t  (mean; h_0 for cls),  then x ← act_k(x·W_kᵀ + b_k) per Dense k

A form that would compute other logits is refused (`ValueError` naming the pooling, the head and
the form to use). `tffl_head.json` records the task type, family, pooling, head, number of
labels and the HF class that computes the same (`hf_equivalent`, SEQ_CLS only).

Example:

>>> import keras_nlp
>>> from models import backbones
>>> from models.lora_targets import LoraConfig, apply_lora
>>> backbone = keras_nlp.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2,
...     hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
>>> _ = apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
>>> model = backbones.build_classifier(backbone, num_classes=2, pooling="mean")
>>> export_task_type(model)
'FEATURE_EXTRACTION'
>>> folder = export_peft(model, run_dir / "mean_adapters", base_model_name_or_path="/abs/base")
>>> sorted(p.name for p in folder.iterdir())
['1_Pooling', '2_Dense', 'adapter_config.json', 'adapter_model.safetensors', 'modules.json', 'sentence_bert_config.json', 'tffl_head.json']
>>> sorted(read_peft(folder)[1])[:2]
['base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight', 'base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight']
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import safetensors.numpy
import tensorflow as tf

from models import peft_names
from models.lora_targets import ALL_TARGETS, LoraConfig, lora_layers
from models.peft_names import CAUSAL_LM, FEATURE_EXTRACTION, PREFIX, SEQ_CLS, module_path
from models.sentence_modules import MODULES_FILE, DenseModule, read_modules, write_modules
from models.sentence_modules import write_tokenizer
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


def head_chain(family: str, pooling: str, head: str) -> list[tuple[str, str]]:
    """(HF module name, activation) of each Dense layer the pooled features pass, in order: a
    trained pooler (tanh), then the head's (`models.backbones.classifier_head`).

    >>> head_chain("bert", "pooler", "dense_tanh")
    [('bert.pooler.dense', 'tanh'), ('classifier.dense', 'tanh'), ('classifier.out_proj', 'identity')]
    """
    chain = [(f"{family}.pooler.dense", "tanh")] if pooling == "pooler" else []
    if head == "dense_tanh":
        return chain + [("classifier.dense", "tanh"), ("classifier.out_proj", "identity")]
    return chain + [("classifier", "identity")]


def _activation(dense: tf.keras.layers.Dense) -> str:
    name = tf.keras.activations.serialize(dense.activation)
    return {"linear": "identity"}.get(name, name) if isinstance(name, str) else str(name)


def _check_head(model: tf.keras.Model, family: str, description: dict) -> None:
    """A one-line ValueError when a head layer is not the Dense its chain says (`head_chain`:
    another activation, no bias): no export form computes such a head."""
    modules = head_modules(model, family)
    for name, activation in head_chain(family, description["pooling"], description["head"]):
        dense = modules[name]
        if _activation(dense) != activation or not dense.use_bias:
            raise ValueError(
                f"head={description['head']!r} (pooling={description['pooling']!r}): its layer "
                f"{dense.name!r} applies {_activation(dense)}"
                f"{'' if dense.use_bias else ' without a bias'}, where a {description['head']} "
                f"head applies {activation} with a bias; no PEFT form reproduces these logits")


def _family(model: tf.keras.Model, family: str | None) -> str:
    if family is not None:
        peft_names.modules_of(family)   # ValueError naming the families
        return family
    return peft_names.family_of(model)


def export_task_type(model: tf.keras.Model, family: str | None = None,
                     task_type: str | None = None) -> str:
    """The PEFT task type `model` exports as: `task_type` when that form reproduces the model's
    outputs, else a one-line `ValueError` naming the pooling and head and the form to use;
    without `task_type`, the form that does (module docstring):

    - CAUSAL_LM for a Gemma 3 decoder LM;
    - SEQ_CLS for an encoder classifier HF's sequence classifier computes (`HF_EQUIVALENT`);
    - FEATURE_EXTRACTION for any other encoder classifier (mean or CLS pooling or a trained
      pooler; a linear or dense_tanh head) and for an encoder without a head.

    A head layer that is not the Dense its head names (`head_chain`) is refused in every form.

    Example:

    >>> import keras_nlp
    >>> from models import backbones
    >>> from models.lora_targets import LoraConfig, apply_lora
    >>> def classifier(pooling):
    ...     backbone = keras_nlp.models.BertBackbone(vocabulary_size=30, num_layers=1,
    ...         num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    ...     apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    ...     return backbones.build_classifier(backbone, num_classes=2, pooling=pooling)
    >>> export_task_type(classifier("pooler"))
    'SEQ_CLS'
    >>> model = classifier("mean")
    >>> export_task_type(model)
    'FEATURE_EXTRACTION'
    >>> export_task_type(model, task_type="SEQ_CLS")
    Traceback (most recent call last):
    ...
    ValueError: task_type=SEQ_CLS: pooling='mean' with head='linear' is not what HF's BertForSequenceClassification computes (the pooler of the CLS token, then a linear classifier), so its logits would differ; export it as FEATURE_EXTRACTION (the adapters of BertModel, with sentence-transformers' pooling and head modules)
    """
    family = _family(model, family)
    if family == "gemma3":
        if task_type not in (None, CAUSAL_LM):
            raise ValueError(f"task_type={task_type}: a Gemma 3 decoder LM exports as "
                             f"{CAUSAL_LM} (its adapters; the LM head is the tied embedding)")
        return CAUSAL_LM
    description = head_description(model, family)
    if description["head"] is not None:
        _check_head(model, family, description)
    if task_type is None:
        return SEQ_CLS if description["hf_equivalent"] else FEATURE_EXTRACTION
    if task_type == FEATURE_EXTRACTION:
        return task_type
    base = {"bert": "BertModel", "roberta": "RobertaModel"}[family]
    form = (f"export it as {FEATURE_EXTRACTION} (the adapters of {base}, with "
            "sentence-transformers' pooling and head modules)")
    if task_type != SEQ_CLS:
        raise ValueError(f"task_type={task_type}: a {family} encoder exports as {SEQ_CLS} or "
                         f"{FEATURE_EXTRACTION}; {form}")
    if description["head"] is None:
        raise ValueError(f"task_type={SEQ_CLS}: {model.name!r} has no classifier head, so "
                         f"a sequence classifier would add an untrained one; {form}")
    if description["hf_equivalent"] is None:
        hf_class = {"bert": "BertForSequenceClassification",
                    "roberta": "RobertaForSequenceClassification"}[family]
        reads = {"bert": "the pooler of the CLS token, then a linear classifier",
                 "roberta": "the CLS token through a dense + tanh + out_proj head"}[family]
        raise ValueError(f"task_type={SEQ_CLS}: pooling={description['pooling']!r} with "
                         f"head={description['head']!r} is not what HF's {hf_class} computes "
                         f"({reads}), so its logits would differ; {form}")
    return task_type


def peft_tensors(model: tf.keras.Model, family: str | None = None,
                 task_type: str | None = None) -> dict[str, np.ndarray]:
    """The PEFT state dict (float32, contiguous) of `model`'s adapters, at their module paths in
    the model PEFT wraps for the task type (`export_task_type`), and for SEQ_CLS of its trained
    head (`modules_to_save`)."""
    family = _family(model, family)
    task_type = export_task_type(model, family, task_type)
    tensors = {}
    for layer, target, wrapper in adapter_sites(model):
        path = PREFIX + module_path(family, layer, target, task_type)
        tensors[f"{path}.lora_A.weight"] = wrapper.lora_a.numpy().T
        tensors[f"{path}.lora_B.weight"] = wrapper.lora_b.numpy().T
    if task_type == SEQ_CLS:
        for name, dense in head_modules(model, family).items():
            tensors[f"{PREFIX}{name}.weight"] = dense.kernel.numpy().T
            tensors[f"{PREFIX}{name}.bias"] = dense.bias.numpy()
    return {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}


def peft_config(model: tf.keras.Model, base_model_name_or_path: str | None = None,
                family: str | None = None, task_type: str | None = None) -> dict:
    """`adapter_config.json` for `model`'s adapters (one rank and α for all: PEFT's r and
    lora_alpha; a `ValueError` otherwise); `task_type` defaults to the form that reproduces the
    model (`export_task_type`, which refuses one that does not)."""
    family = _family(model, family)
    task_type = export_task_type(model, family, task_type)
    sites = adapter_sites(model)
    ranks = {w.rank for _, _, w in sites}
    alphas = {w.alpha for _, _, w in sites}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(f"Adapters have ranks {sorted(ranks)} and alphas {sorted(alphas)}; "
                         "the export supports one rank and one alpha.")
    if any(w.merged for _, _, w in sites):
        raise ValueError("Adapters are merged into their kernels; unmerge_lora first.")
    target_modules = peft_names.target_modules(family, [(i, t) for i, t, _ in sites],
                                               peft_names.num_layers(model), task_type)
    heads = head_modules(model, family) if task_type == SEQ_CLS else {}
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


def _dense_modules(model: tf.keras.Model, family: str, description: dict) -> list[DenseModule]:
    """The pooler and head of `model` as sentence-transformers Dense modules (`head_chain`)."""
    modules = head_modules(model, family)
    return [DenseModule(modules[name].kernel.numpy().T, modules[name].bias.numpy(), activation)
            for name, activation in head_chain(family, description["pooling"],
                                               description["head"])]


def export_peft(model: tf.keras.Model, output_dir: str | pathlib.Path,
                base_model_name_or_path: str | None = None, family: str | None = None,
                task_type: str | None = None, vocabulary: str | pathlib.Path | None = None,
                max_seq_length: int | None = None) -> pathlib.Path:
    """Writes `model`'s adapters (a KerasNLP BERT / RoBERTa classifier or encoder, or a Gemma 3
    decoder LM, with `apply_lora` adapters) into `output_dir` in the PEFT form that reproduces
    it (`export_task_type`; `task_type` asks for one, and a form that would compute other
    logits is a `ValueError`, with nothing written):

    - `adapter_model.safetensors`, `adapter_config.json` (`peft_tensors`, `peft_config`; its
      `base_model_name_or_path` is `base_model_name_or_path`: a hub name or an absolute path,
      which PEFT and sentence-transformers load the base from);
    - `tffl_head.json`: task type, family, pooling, head, num_labels, hf_equivalent;
    - FEATURE_EXTRACTION classifiers: the sentence-transformers modules of the pooling and head
      (`models.sentence_modules.write_modules`; `sentence_bert_config.json` with
      `max_seq_length`), and with `vocabulary` (a WordPiece `vocab.txt`) the tokenizer files, so
      that `SentenceTransformer(output_dir)` loads the folder whole.
    """
    family = _family(model, family)
    task_type = export_task_type(model, family, task_type)
    config = peft_config(model, base_model_name_or_path, family, task_type)
    tensors = peft_tensors(model, family, task_type)
    head = head_description(model, family)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(output_dir / ADAPTER_WEIGHTS),
                                metadata={"format": "pt"})
    (output_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    if task_type == FEATURE_EXTRACTION and head["head"] is not None:
        pooling = "mean" if head["pooling"] == "mean" else "cls"   # a pooler: CLS, then a Dense
        hidden = head_modules(model, family)[head_chain(family, head["pooling"],
                                                        head["head"])[0][0]].kernel.shape[0]
        write_modules(output_dir, pooling, _dense_modules(model, family, head), int(hidden),
                      max_seq_length)
        if vocabulary is not None:
            write_tokenizer(output_dir, vocabulary, model_max_length=max_seq_length)
    head = head | {"family": family, "task_type": task_type}
    (output_dir / HEAD_FILE).write_text(json.dumps(head, indent=2, sort_keys=True))
    return output_dir


def _seq_cls_names(folder: pathlib.Path, config: dict, tensors: dict,
                   family: str | None) -> dict[str, np.ndarray]:
    """A FEATURE_EXTRACTION folder's tensors under the names a SEQ_CLS folder gives them: the
    adapters with their family's prefix, the sentence-transformers Dense modules (when the
    folder has them) as the head modules `tffl_head.json`'s pooling and head say they are."""
    head = (json.loads((folder / HEAD_FILE).read_text())
            if (folder / HEAD_FILE).is_file() else {})
    family = head.get("family") or family
    if family is None:
        raise ValueError(f"{folder}: a {config['task_type']} folder's adapters are a base "
                         f"model's; no {HEAD_FILE} says whose (pass family=)")
    renamed = {PREFIX + family + "." + k[len(PREFIX):]
               if k.startswith(PREFIX + "encoder.layer.") else k: v for k, v in tensors.items()}
    if not (folder / MODULES_FILE).is_file():
        return renamed
    if head.get("head") is None:
        raise ValueError(f"{folder}: it has sentence-transformers modules but no {HEAD_FILE} "
                         "naming the head they are")
    chain = head_chain(family, head["pooling"], head["head"])
    pooling, dense = read_modules(folder)
    wanted = ("mean" if head["pooling"] == "mean" else "cls", [a for _, a in chain])
    if (pooling, [d.activation for d in dense]) != wanted:
        raise ValueError(f"{folder}: its modules pool by {pooling} through Dense "
                         f"{[d.activation for d in dense]}, not the {head['pooling']} pooling "
                         f"and {head['head']} head its {HEAD_FILE} names")
    for (name, _), module in zip(chain, dense):
        renamed[f"{PREFIX}{name}.weight"] = module.weight
        renamed[f"{PREFIX}{name}.bias"] = module.bias
    return renamed


def read_peft(folder: str | pathlib.Path,
              family: str | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """`(adapter_config, tensors)` of a PEFT LoRA folder, the tensors named as in a SEQ_CLS or
    CAUSAL_LM folder whatever its form: a FEATURE_EXTRACTION folder's adapter keys get their
    family's prefix (its `tffl_head.json`'s family, else `family`) and its sentence-transformers
    Dense modules the names of the head modules they are (`head_chain`)."""
    folder = pathlib.Path(folder)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{folder}: peft_type {config.get('peft_type')!r} is not LORA.")
    for key, wanted in (("fan_in_fan_out", False), ("use_dora", False), ("use_rslora", False)):
        if config.get(key, wanted) != wanted:
            raise ValueError(f"{folder}: {key}={config[key]!r} is not supported.")
    tensors = safetensors.numpy.load_file(str(folder / ADAPTER_WEIGHTS))
    if config.get("task_type") == FEATURE_EXTRACTION:
        tensors = _seq_cls_names(folder, config, tensors, family)
    return config, tensors


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
    config, tensors = read_peft(folder, family)
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


def _check_pooling(model, where: str, folder: pathlib.Path, family: str) -> None:
    """A ValueError naming `pooling` when the folder's classifier (its `tffl_head.json`) pools
    otherwise than `model`'s: the same head weights would read other features."""
    if not (folder / HEAD_FILE).is_file():
        return
    theirs = json.loads((folder / HEAD_FILE).read_text()).get("pooling")
    ours = head_description(model, family)["pooling"]
    if theirs is not None and ours is not None and theirs != ours:
        raise ValueError(f"{where}: its classifier pools by {theirs}, this run's by {ours}: "
                         f"set pooling={theirs}")


def folder_lora_config(folder: str | pathlib.Path, family: str | None = None) -> LoraConfig:
    """The `models.lora_targets.LoraConfig` whose `apply_lora` gives a backbone the adapters a
    PEFT folder holds: its `r` and `lora_alpha`, the targets and layers its tensors adapt (to
    build the model `import_peft` / `init_adapters` then fill). A folder that does not adapt
    every one of its targets on every one of its layers (which no one `LoraConfig` builds), or
    holds no adapters, is a one-line `ValueError` naming the folder.

    >>> import keras_nlp
    >>> from models.lora_targets import apply_lora
    >>> backbone = keras_nlp.models.BertBackbone(vocabulary_size=30, num_layers=2, num_heads=2,
    ...     hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    >>> _ = apply_lora(backbone, LoraConfig(rank=2, alpha=4.0, targets=("query", "value"),
    ...                                     layers=(1,)))
    >>> config = folder_lora_config(export_peft(backbone, run_dir / "encoder_adapters"))
    >>> config.rank, config.alpha, config.targets, config.layers
    (2, 4.0, ('query', 'value'), (1,))
    """
    folder = pathlib.Path(folder)
    config, tensors = read_peft(folder, family)
    _, sites = _folder_sites(tensors)
    if not sites:
        raise ValueError(f"{folder}: no LoRA adapters in {ADAPTER_WEIGHTS}")
    layers = sorted({i for i, _ in sites})
    targets = sorted({t for _, t in sites}, key=list(ALL_TARGETS).index)
    missing = sorted({(i, t) for i in layers for t in targets} - sites)
    if missing:
        raise ValueError(f"{folder}: it adapts {_sites_text(sites)} but not {missing[0][1]} of "
                         f"layer {missing[0][0]}; one LoRA configuration adapts every target "
                         "of every layer it names")
    return LoraConfig(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                      targets=tuple(targets), layers=tuple(layers))


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
        config, tensors = read_peft(
            folder, family or (peft_names.family_of(model) if _has_backbone(model) else None))
        family = _check_folder(model, where, config, tensors, family)
        _check_pooling(model, where, folder, family)
        plan = _planned_assignments(model, family, config, tensors)
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith(where) else
                         f"{where}: {message.rstrip('.')}: set `backbone`, `head` and `pooling` "
                         "as in the run that exported it, and its `task`") from None
    import_peft(model, folder, family)
    return [variable.name for variable, _ in plan]
