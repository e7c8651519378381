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

Step 1 is `runner.crosscheck.write_reference` (its docstring says what it writes: for Gemma 3
the dequantized GGUF as HF's checkpoint, `model.safetensors` + `config.json`, and tffl's
last-position logits of its prompts with and without the adapters; for BERT tffl's classifier
rebuilt from the base and the folder, and its logits of its sentences). Step 2, here, reads
`--work_dir` and the folder only (this Python has no tffl): for Gemma 3 it builds
`Gemma3ForCausalLM` from those files (eager attention, float32), wraps it with
`peft.PeftModel.from_pretrained(adapters)` and prints, per prompt, the largest logit difference
to tffl's, whether the top-1 tokens agree, and how far the adapters moved the logits; for BERT it
loads the base and wraps it with `peft.PeftModel.from_pretrained(model, adapters)`: for SEQ_CLS,
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
    ids, prompts = json.loads(str(ours["ids"])), json.loads(str(ours["texts"]))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}")
    print("| prompt | top-1 tffl | top-1 HF+PEFT | max abs logit diff | adapters moved logits by |")
    print("|---|---|---|---|---|")
    agree = True
    for k, prompt in enumerate(prompts):
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor([ids[k]])).logits[0, -1].double().numpy()
        mine, base = ours["adapted"][k], ours["base"][k]
        agree &= int(np.argmax(mine)) == int(np.argmax(theirs))
        print(f"| {prompt!r} | {int(np.argmax(mine))} | {int(np.argmax(theirs))} | "
              f"{np.abs(mine - theirs).max():.2e} | {np.abs(mine - base).max():.3f} |")
    return 0 if agree else 1


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
    for k, sentence in enumerate(json.loads(str(ours["texts"]))):
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
    if "check" in args:
        config = json.loads((adapters / "adapter_config.json").read_text())
        check = check_decoder if config["task_type"] == "CAUSAL_LM" else check_encoder
        return check(adapters, work_dir)
    from runner import crosscheck   # tffl's venv only (the first step)

    print(crosscheck.write_reference(adapters, work_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
