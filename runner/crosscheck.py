"""The tffl side of PEFT's cross-check (`scripts/peft_crosscheck.py`): what a PEFT folder that
`runner.export` wrote computes in tffl, written down for PyTorch to compare against.

`write_reference(adapters, work_dir)` is the check's first step, in tffl's environment; the
second, in a PyTorch one, loads the folder with `peft` and transformers and compares its logits
with the ones written here. It reads only `work_dir`'s files and the folder, never this package,
so the texts go into `tffl_logits.npz` too (`texts`).

- Gemma 3 (a CAUSAL_LM folder): the Q4_K_M GGUF dequantized and written as HF's
  `Gemma3ForCausalLM` checkpoint (`models.gguf_checkpoint.save_hf_checkpoint`: HF's names, the
  norms without llama.cpp's "+1", transformers' config), then tffl's decoder with the folder's
  adapters (`models.peft_export.import_peft`) and its last-position logits of `PROMPTS`, with
  (`adapted`) and without (`base`) the adapters, and the prompts' token ids (`ids`).
- A BERT classifier (SEQ_CLS or FEATURE_EXTRACTION): its base is the folder's `base/` (a
  tiny-backbone run's) or all-MiniLM-L6-v2 (`models.checkpoints.fetch_minilm`); tffl's
  classifier rebuilt from the base and the folder (as its `tffl_head.json` says) and its logits
  of `SENTENCES`, with (`logits`) and without (`without_adapters`) the adapters, with the token
  ids and padding mask it read and the base's folder (`base`).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

SENTENCES = ["a gorgeous, witty, seductive movie.", "the plot is nothing but boilerplate clichés.",
             "it's a charming and often affecting journey.", "unflinchingly bleak and desperate",
             "the acting, costumes, music, cinematography and sound are all astounding"]
PROMPTS = ["The capital of France is", "Once upon a time, there was a",
           "def fibonacci(n):", "Review: a gorgeous, witty, seductive movie.\nSentiment:",
           "Review: the plot is nothing but boilerplate clichés.\nSentiment:"]
LOGITS_FILE = "tffl_logits.npz"
# Tokens per sentence of the encoder's reference (every one of `SENTENCES` fits).
SEQUENCE_LENGTH = 32


def write_reference(adapters: str | pathlib.Path, work_dir: str | pathlib.Path) -> str:
    """The first step for the folder `adapters` (module docstring), into `work_dir`: the decoder's
    or the classifier's, as its `adapter_config.json` says; returns a line saying what it
    wrote."""
    adapters, work_dir = pathlib.Path(adapters), pathlib.Path(work_dir)
    config = json.loads((adapters / "adapter_config.json").read_text())
    write = write_decoder if config["task_type"] == "CAUSAL_LM" else write_encoder
    return write(adapters, work_dir)


def adapted_decoder(path, adapters: pathlib.Path):
    """`(backbone, tokenizer)`: tffl's Gemma 3 from the GGUF file `path` with the folder's
    adapters."""
    from models import gguf_checkpoint
    from models import peft_export
    from models.lora_targets import apply_lora

    backbone, tokenizer = gguf_checkpoint.load_gemma3(path)
    apply_lora(backbone, peft_export.folder_lora_config(adapters))
    peft_export.import_peft(backbone, adapters)
    return backbone, tokenizer


def last_logits(backbone, ids: list[int]) -> np.ndarray:
    """The decoder's next-token logits after the token ids `ids`."""
    token_ids = np.asarray([ids], np.int32)
    hidden = backbone({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    return backbone.token_embedding(hidden[:, -1], reverse=True).numpy()[0]


def write_decoder(adapters: pathlib.Path, work_dir: pathlib.Path, path=None) -> str:
    """The first step for a Gemma 3 folder (module docstring); `path` is the GGUF file (default:
    Gemma 3 270M's, `models.gguf_checkpoint.fetch_gemma3_270m`)."""
    from models import gguf_checkpoint
    from models.gemma3_tokenizer import GEMMA3_BOS

    path = gguf_checkpoint.fetch_gemma3_270m() if path is None else path
    gguf_checkpoint.save_hf_checkpoint(path, work_dir)
    backbone, tokenizer = adapted_decoder(path, adapters)
    ids = [[GEMMA3_BOS] + tokenizer(p).numpy().tolist() for p in PROMPTS]
    adapted = [last_logits(backbone, i) for i in ids]
    base, _ = gguf_checkpoint.load_gemma3(path)
    np.savez(work_dir / LOGITS_FILE, adapted=np.stack(adapted),
             base=np.stack([last_logits(base, i) for i in ids]),
             ids=np.array(json.dumps(ids)), texts=np.array(json.dumps(PROMPTS)))
    return (f"wrote the HF checkpoint, its config and tffl's logits of {len(ids)} prompts to "
            f"{work_dir}")


def encoder_base(adapters: pathlib.Path) -> pathlib.Path:
    """The folder of the HF BERT the adapters adapt: the export's `base/`, else all-MiniLM-L6-v2's
    (`models.checkpoints.fetch_minilm`)."""
    if (adapters / "base").is_dir():
        return adapters / "base"
    from models import checkpoints

    return checkpoints.fetch_minilm()


def write_encoder(adapters: pathlib.Path, work_dir: pathlib.Path) -> str:
    """The first step for a BERT classifier's folder (module docstring)."""
    import tensorflow as tf

    from models import backbones
    from models import hf_bert
    from models import peft_export
    from models.lora_targets import apply_lora
    from models.lora_targets import lora_layers
    from tasks import text

    head = json.loads((adapters / peft_export.HEAD_FILE).read_text())
    base = encoder_base(adapters)
    backbone, _ = hf_bert.load_hf_bert(base)
    apply_lora(backbone, peft_export.folder_lora_config(adapters))
    model = backbones.build_classifier(backbone, head["num_labels"], pooling=head["pooling"],
                                       head=head["head"])
    peft_export.import_peft(model, adapters)
    x = text.bert_packer(base / "vocab.txt", SEQUENCE_LENGTH)(tf.constant(SENTENCES))
    adapted = model(x).numpy()
    for wrapper in lora_layers(model):
        wrapper.lora_b.assign(tf.zeros_like(wrapper.lora_b))
    work_dir.mkdir(parents=True, exist_ok=True)
    np.savez(work_dir / LOGITS_FILE, logits=adapted, without_adapters=model(x).numpy(),
             token_ids=x["token_ids"].numpy(), padding_mask=x["padding_mask"].numpy(),
             base=np.array(str(base)), texts=np.array(json.dumps(SENTENCES)))
    return (f"wrote tffl's logits of {len(SENTENCES)} sentences ({head['pooling']} pooling, "
            f"{head['head']} head, base {base}) to {work_dir}")
