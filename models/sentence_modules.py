"""A text classifier's pooling and head as sentence-transformers modules, written and read.

sentence-transformers loads a model folder as the pipeline its `modules.json` lists, each module
from its own sub-folder, and so does a person who reads the files by hand:

    modules.json                Transformer at "", Pooling at "1_Pooling", Dense at "2_Dense", ...
    sentence_bert_config.json   the Transformer's max_seq_length
    1_Pooling/config.json       word_embedding_dimension, pooling_mode_mean_tokens / _cls_token
    k_Dense/config.json         in_features, out_features, bias, activation_function
    k_Dense/model.safetensors   linear.weight (out_features, in_features), linear.bias (out,)

For the Transformer's last hidden state h (batch, seq, hidden) and attention mask m (batch, seq)
the pipeline computes

    x = Σ_t m_t h_t / Σ_t m_t          pooling "mean"   (x = h_0 for "cls")
    x ← act_k(x·W_kᵀ + b_k)            each Dense k in order, act_k Identity or Tanh

so a classifier's pooled features and head (`models.backbones.build_classifier`) are a Pooling
module and one Dense per head layer, the last one's output the logits. The Transformer module at
"" is the folder itself: Hugging Face transformers loads it (a PEFT adapter folder loads as its
base model with the adapters), and its tokenizer from the folder's tokenizer files
(`write_tokenizer`). Weights are stored as torch's `nn.Linear` stores them, W (out, in).

Example:

>>> import tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> head = DenseModule(np.ones((2, 4), np.float32), np.zeros(2, np.float32), "identity")
>>> write_modules(folder, "mean", [head], hidden_size=4)
['modules.json', 'sentence_bert_config.json', '1_Pooling/config.json', '2_Dense/config.json', '2_Dense/model.safetensors']
>>> pooling, dense = read_modules(folder)
>>> pooling, dense[0].weight.shape, dense[0].activation
('mean', (2, 4), 'identity')
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import safetensors.numpy

from models.checkpoints import declared_pooling

MODULES_FILE = "modules.json"
CONFIG_FILE = "sentence_bert_config.json"
POOLING_DIR = "1_Pooling"
WEIGHTS_FILE = "model.safetensors"
# sentence-transformers' module classes, by the names its modules.json files give them.
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
DENSE = "sentence_transformers.models.Dense"
# A Dense module's activation_function (a torch.nn class, instantiated by sentence-transformers).
ACTIVATIONS = {"identity": "torch.nn.modules.linear.Identity",
               "tanh": "torch.nn.modules.activation.Tanh"}
POOLING_MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}
_ALL_POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                      "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")


@dataclasses.dataclass(frozen=True)
class DenseModule:
    """One Dense module: y = act(x·Wᵀ + b).

    Attributes:
      weight: W, (out_features, in_features), as torch's `nn.Linear` stores it.
      bias: b, (out_features,).
      activation: "identity" or "tanh" (`ACTIVATIONS`).
    """

    weight: np.ndarray
    bias: np.ndarray
    activation: str


def _check_pooling(pooling: str) -> None:
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling={pooling!r}: sentence-transformers' Pooling module computes "
                         f"{' or '.join(POOLING_MODES)} here.")


def write_modules(folder: str | pathlib.Path, pooling: str, dense: list[DenseModule],
                  hidden_size: int, max_seq_length: int | None = None) -> list[str]:
    """Writes the pipeline Transformer (the folder) → Pooling(`pooling`) → `dense` into `folder`:
    `modules.json`, `sentence_bert_config.json` (with `max_seq_length` when given),
    `1_Pooling/config.json` and `<k>_Dense/{config.json, model.safetensors}` for k = 2, 3, ...;
    returns the files written, relative to `folder`.

    Args:
      pooling: "mean" (the padding-masked mean) or "cls" (the first token's state).
      dense: the Dense modules after the pooling, in order (each one's in_features the previous
        one's out_features, the first one's `hidden_size`).
      hidden_size: the Transformer's hidden size, the pooled features' width.
    """
    _check_pooling(pooling)
    width = hidden_size
    for k, module in enumerate(dense):
        if module.activation not in ACTIVATIONS:
            raise ValueError(f"Dense module {k}: activation {module.activation!r}; "
                             f"sentence-transformers' Dense takes {', '.join(ACTIVATIONS)} here.")
        if module.weight.shape[1] != width or module.bias.shape != module.weight.shape[:1]:
            raise ValueError(f"Dense module {k}: weight {module.weight.shape} and bias "
                             f"{module.bias.shape} do not take {width} features.")
        width = module.weight.shape[0]
    folder = pathlib.Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": POOLING}]
    files = {MODULES_FILE: None,
             CONFIG_FILE: {"do_lower_case": False}
             | ({"max_seq_length": int(max_seq_length)} if max_seq_length else {}),
             f"{POOLING_DIR}/config.json": {"word_embedding_dimension": int(hidden_size)}
             | {mode: mode == POOLING_MODES[pooling] for mode in _ALL_POOLING_MODES}}
    weights = {}
    for k, module in enumerate(dense, start=2):
        path = f"{k}_Dense"
        modules.append({"idx": k, "name": str(k), "path": path, "type": DENSE})
        files[f"{path}/config.json"] = {
            "in_features": int(module.weight.shape[1]), "out_features": int(module.weight.shape[0]),
            "bias": True, "activation_function": ACTIVATIONS[module.activation]}
        files[f"{path}/{WEIGHTS_FILE}"] = None
        weights[f"{path}/{WEIGHTS_FILE}"] = {
            "linear.weight": np.ascontiguousarray(module.weight, np.float32),
            "linear.bias": np.ascontiguousarray(module.bias, np.float32)}
    files[MODULES_FILE] = modules
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if name in weights:
            safetensors.numpy.save_file(weights[name], str(folder / name),
                                        metadata={"format": "pt"})
        else:
            (folder / name).write_text(json.dumps(content, indent=2))
    return list(files)


def read_modules(folder: str | pathlib.Path) -> tuple[str, list[DenseModule]]:
    """`(pooling, dense modules)` of a folder `write_modules` wrote (or any sentence-transformers
    folder of a Transformer, one mean or CLS Pooling and Identity / Tanh Dense modules).

    Raises:
      ValueError: `modules.json` lists another pipeline, or a module is not one of those.
    """
    folder = pathlib.Path(folder)
    modules = json.loads((folder / MODULES_FILE).read_text())
    kinds = [m.get("type") for m in modules]
    if kinds[:2] != [TRANSFORMER, POOLING] or any(k != DENSE for k in kinds[2:]):
        raise ValueError(f"{folder / MODULES_FILE}: modules {kinds}; a classifier's pipeline is "
                         "a Transformer, a Pooling and Dense modules")
    pooling = declared_pooling(folder) if modules[1]["path"] == POOLING_DIR else None
    if pooling is None:
        raise ValueError(f"{folder}: no Pooling module config at {POOLING_DIR}/config.json")
    dense = []
    for module in modules[2:]:
        config = json.loads((folder / module["path"] / "config.json").read_text())
        activation = {v: k for k, v in ACTIVATIONS.items()}.get(config.get("activation_function"))
        if activation is None or not config.get("bias", True):
            raise ValueError(f"{folder / module['path']}: activation "
                             f"{config.get('activation_function')!r}, bias "
                             f"{config.get('bias', True)}; read here: {', '.join(ACTIVATIONS)} "
                             "with a bias")
        tensors = safetensors.numpy.load_file(str(folder / module["path"] / WEIGHTS_FILE))
        dense.append(DenseModule(tensors["linear.weight"], tensors["linear.bias"], activation))
    return pooling, dense


def write_tokenizer(folder: str | pathlib.Path, vocabulary: str | pathlib.Path,
                    lowercase: bool = True, strip_accents: bool = False,
                    model_max_length: int | None = None) -> list[str]:
    """Writes a WordPiece tokenizer as Hugging Face's `BertTokenizer` loads it (`vocab.txt`,
    `tokenizer_config.json`, `special_tokens_map.json`) into `folder`, from the `vocab.txt` at
    `vocabulary`; returns the files written, relative to `folder`. The defaults are the
    tokenizer tffl's text tasks train with (`tasks.text.bert_packer`: KerasNLP's
    `BertTokenizer(lowercase=True)`, which keeps accents; HF's `do_lower_case` alone would strip
    them).

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "v.txt").write_text("[PAD]\\n[UNK]\\n[CLS]\\n[SEP]\\n[MASK]\\nhello\\n")
    >>> write_tokenizer(folder / "out", folder / "v.txt")
    ['vocab.txt', 'tokenizer_config.json', 'special_tokens_map.json']
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(vocabulary, folder / "vocab.txt")
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]"}
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase,
              "strip_accents": strip_accents, "tokenize_chinese_chars": True} | special
    if model_max_length:
        config["model_max_length"] = int(model_max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return ["vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]
