"""Hugging Face module names of our LoRA sites, per backbone family: the keys of PEFT's files.

An adapted projection is a transformer layer index i and a target (`models.lora_targets`); its
HF module path is

    bert / roberta (KerasNLP encoders; HF BertModel / RobertaModel):
        <family>.encoder.layer.<i>.<ENCODER_MODULES[target]>    e.g. bert.encoder.layer.0.attention.self.query
    gemma3 (our Gemma 3 decoder, `models.gemma3_backbone`; HF Gemma3ForCausalLM):
        model.layers.<i>.<DECODER_MODULES[target]>              e.g. model.layers.14.self_attn.q_proj

and PEFT stores its factors as `base_model.model.<path>.lora_{A,B}.weight`. Those are the paths
inside the model PEFT wraps for the SEQ_CLS and CAUSAL_LM task types (HF
`BertForSequenceClassification`, `Gemma3ForCausalLM`); FEATURE_EXTRACTION adapters wrap the
encoder's base model (HF `BertModel` / `RobertaModel`, what `AutoModel` loads), whose paths lack
the family prefix: `encoder.layer.<i>.<module>`. Gemma 3's GGUF tensors (what `models.gguf_checkpoint` loads) are HF's, renamed without any permutation
(llama.cpp's converter shifts only the norms), so `blk.<i>.attn_q` is `model.layers.<i>.
self_attn.q_proj.weight`: the adapters export to HF's google/gemma-3-270m.

>>> module_path("bert", 0, "value")
'bert.encoder.layer.0.attention.self.value'
>>> module_path("gemma3", 14, "ffn_gate")
'model.layers.14.mlp.gate_proj'
>>> module_path("bert", 0, "value", task_type=FEATURE_EXTRACTION)
'encoder.layer.0.attention.self.value'
>>> parse_lora_key("base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight")
('gemma3', 3, 'value')
"""

from __future__ import annotations

import re

import tensorflow as tf

PREFIX = "base_model.model."
ENCODER_FAMILIES = ("bert", "roberta")
FAMILIES = (*ENCODER_FAMILIES, "gemma3")
ENCODER_MODULES = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_output": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}
DECODER_MODULES = {
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "attention_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_in": "mlp.up_proj",
    "ffn_out": "mlp.down_proj",
}
# PEFT's task types: what model its adapters wrap (a sequence classifier, an encoder's base model,
# a causal LM), and the task type each family's models export as unless told otherwise.
SEQ_CLS, FEATURE_EXTRACTION, CAUSAL_LM = "SEQ_CLS", "FEATURE_EXTRACTION", "CAUSAL_LM"
TASK_TYPES = {"bert": SEQ_CLS, "roberta": SEQ_CLS, "gemma3": CAUSAL_LM}
GEMMA3_270M_HUB_NAME = "google/gemma-3-270m"


def modules_of(family: str) -> dict[str, str]:
    """{target: HF module path below the layer} of `family` (ValueError for another family)."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: choose one of {', '.join(FAMILIES)}.")
    return DECODER_MODULES if family == "gemma3" else ENCODER_MODULES


def module_path(family: str, layer: int, target: str, task_type: str | None = None) -> str:
    """The HF module path of `target` in transformer layer `layer` of a `family` model, inside
    the model PEFT wraps for `task_type` (default the family's, `TASK_TYPES`): an encoder's
    `<family>.encoder.layer.<i>.<module>` in its sequence classifier, `encoder.layer.<i>.<module>`
    in its base model (FEATURE_EXTRACTION)."""
    modules = modules_of(family)
    if target not in modules:
        raise ValueError(f"{family} has no {target!r} module; its targets are "
                         f"{', '.join(modules)}.")
    if family == "gemma3":
        return f"model.layers.{layer}.{modules[target]}"
    path = f"encoder.layer.{layer}.{modules[target]}"
    return path if task_type == FEATURE_EXTRACTION else f"{family}.{path}"


def _key_pattern() -> re.Pattern:
    def alternatives(modules):
        return "|".join(re.escape(m) for m in modules.values())

    return re.compile(
        "^" + re.escape(PREFIX) + r"(?:(?P<encoder>" + "|".join(ENCODER_FAMILIES)
        + r")\.encoder\.layer\.(?P<i>\d+)\.(?P<em>" + alternatives(ENCODER_MODULES)
        + r")|model\.layers\.(?P<j>\d+)\.(?P<dm>" + alternatives(DECODER_MODULES)
        + r"))\.lora_A\.weight$")


_LORA_KEY = _key_pattern()


def parse_lora_key(key: str) -> tuple[str, int, str] | None:
    """`(family, layer, target)` of a PEFT `lora_A` key, or None for any other key."""
    match = _LORA_KEY.match(key)
    if match is None:
        return None
    if match.group("encoder"):
        target = {m: t for t, m in ENCODER_MODULES.items()}[match.group("em")]
        return match.group("encoder"), int(match.group("i")), target
    target = {m: t for t, m in DECODER_MODULES.items()}[match.group("dm")]
    return "gemma3", int(match.group("j")), target


def family_of(model: tf.keras.Model) -> str:
    """"bert", "roberta" or "gemma3": the backbone `model` is or contains (ValueError naming
    the families PEFT export covers otherwise)."""
    import keras_nlp

    from models.gemma3_backbone import Gemma3Backbone

    for module in [model, *model.submodules]:
        if isinstance(module, keras_nlp.models.RobertaBackbone):
            return "roberta"
        if isinstance(module, keras_nlp.models.BertBackbone):
            return "bert"
        if isinstance(module, Gemma3Backbone):
            return "gemma3"
    raise ValueError(f"{model.name!r} holds no KerasNLP BERT / RoBERTa backbone or Gemma 3 "
                     "decoder: PEFT export covers these (GPT-2's fused c_attn has no separate "
                     "query and value modules to adapt).")


def num_layers(model: tf.keras.Model) -> int | None:
    """The number of transformer layers of the backbone in `model`, or None when `model` holds
    none (a prefix-cached suffix model)."""
    import keras_nlp

    from models.gemma3_backbone import Gemma3Backbone

    kinds = (keras_nlp.models.BertBackbone, keras_nlp.models.RobertaBackbone, Gemma3Backbone)
    for module in [model, *model.submodules]:
        if isinstance(module, kinds):
            return len(module.transformer_layers)
    return None


def target_modules(family: str, sites: list[tuple[int, str]], layers_in_model: int | None,
                   task_type: str | None = None) -> list[str] | str:
    """PEFT's `target_modules` for adapters at `sites` ((layer, target) pairs): the modules'
    last names when every one of the model's `layers_in_model` layers carries the same targets
    and each such name is one module's (PEFT matches names as suffixes: BERT's `dense` is
    three), else a regex that fullmatches exactly the adapted modules' paths (`module_path` for
    `task_type`)."""
    modules = modules_of(family)
    targets = sorted({t for _, t in sites}, key=list(modules).index)
    layers = sorted({i for i, _ in sites})
    last = {t: modules[t].rsplit(".", 1)[-1] for t in modules}
    unique = [t for t in targets if list(last.values()).count(last[t]) == 1]
    if (len(sites) == len(targets) * len(layers) and unique == targets
            and layers_in_model is not None and layers == list(range(layers_in_model))):
        return [last[t] for t in targets]
    paths = [module_path(family, i, t, task_type) for i, t in sites]
    return "(?:.*\\.)?(?:" + "|".join(re.escape(p) for p in paths) + ")"
