"""A training run's LoRA adapters (and trained head) in Hugging Face PEFT's format, in the form
that computes the run's logits outside tffl (what `scripts/export_adapters.py` runs).

`export_run(run_dir, output_dir)` reads the newest checkpoint of the run folder
(`checkpoints/round_xxxxxx/`, `tffl.simulation.checkpoint`) and the run's configuration (its
`config.json`; for runs from before it, the identity its `meta.json` recorded,
`runner.training.run_identity`), rebuilds the task and the algorithm's process from it exactly as
`scripts/train.py` does, loads the state into it and sets the client model to
`process.model_weights(state)` (`runner.trained_run.trained_model`), then writes
`models.peft_export.export_peft`'s folder, plus `export.json` (run, round, flags, task type and,
for a decoder, how its training rows were prompted).

The form (PEFT task type) is the one that reproduces the classifier
(`models.peft_export.export_task_type`; docs/models.md): SEQ_CLS for `pooling="pooler"` with
`head="linear"` (HF's `BertForSequenceClassification`); FEATURE_EXTRACTION for every other text
classifier, e.g. the default mean pooling: the adapters of `BertModel`, the pooling and head as
sentence-transformers modules (`modules.json`, `1_Pooling/`, `2_Dense/`) and the tokenizer files
(the text tasks: sst2, reviews and a user's `text` run); CAUSAL_LM for the instruction tasks
(sst2_instruct, reviews_instruct and a user's `instruct` run) on the `gemma3_270m` backbone,
adapters of `google/gemma-3-270m`'s modules, trained on the weights dequantized from its Q4_K_M
GGUF. A `task_type` that would compute other logits (SEQ_CLS for mean pooling) is a one-line
`ValueError`, raised before anything is written.

`adapter_config.json` names the base model as an absolute path or a hub name: all-MiniLM-L6-v2's
`sentence-transformers/all-MiniLM-L6-v2`, Gemma 3's `google/gemma-3-270m`; the random tiny
backbone has no other home than `<output_dir>/base/`, a HF `BertModel` checkpoint
(`config.json`, `model.safetensors`, `vocab.txt`; with the prefix cache, assembled from the
prefix model's embeddings and lower encoders and the client model's upper ones,
`models.hf_weights.save_base`), named by its absolute path (moving the folder means editing
`base_model_name_or_path`, or exporting again with another `base_model`).

`data_dir` and `frozen_dir` replace the recorded ones (runs from before config.json did not
record them). The gpt2_tiny decoder is a random byte-level toy with no Hugging Face counterpart,
so its runs do not export (`check_exportable`).
"""

from __future__ import annotations

import json
import pathlib
import shutil

from runner.trained_run import trained_model

MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
EXPORT_FILE = "export.json"


def check_exportable(run_dir, config: dict) -> None:
    """A one-line ValueError unless the run's task and backbone (`config`, the run's recorded
    flags) have a PEFT counterpart."""
    from models.decoders import HUB_NAMES
    from tasks.instruct_run_task import INSTRUCT_TASKS
    from tasks.text_run_task import TEXT_TASKS

    task, backbone = config.get("task"), config.get("backbone")
    if task not in TEXT_TASKS + INSTRUCT_TASKS:
        raise ValueError(f"run_dir={run_dir}: task {task!r} has no LoRA backbone; PEFT export "
                         f"covers {', '.join(TEXT_TASKS + INSTRUCT_TASKS)}")
    if task in INSTRUCT_TASKS and backbone not in HUB_NAMES:
        raise ValueError(f"run_dir={run_dir}: backbone {backbone!r} has no Hugging Face "
                         f"counterpart to adapt; PEFT export covers the decoders "
                         f"{', '.join(HUB_NAMES)}")


def export_run(run_dir, output_dir, data_dir=None, frozen_dir=None, base_model=None,
               task_type=None) -> dict:
    """Writes the PEFT folder of `run_dir`'s newest checkpoint to `output_dir` (and, for a
    random backbone, its frozen base to `output_dir/base`, named by its absolute path); returns
    `export.json`'s record. `base_model` replaces adapter_config.json's base model, `task_type`
    the form (module docstring). A `task_type` that would not reproduce the run's logits is a
    `ValueError`, raised before anything is written."""
    from models import hf_weights
    from models import peft_export
    from models.decoders import HUB_NAMES

    run_dir, output_dir = pathlib.Path(run_dir), pathlib.Path(output_dir)
    model, meta, config, task = trained_model(
        run_dir, data_dir, frozen_dir, lambda recorded: check_exportable(run_dir, recorded))
    decoder = HUB_NAMES.get(config.model.backbone)
    family = "gemma3" if decoder else "bert"
    task_type = peft_export.export_task_type(model, family, task_type)
    export_base = config.model.backbone != "minilm" and decoder is None
    if base_model is None:
        base_model = decoder or (MINILM_HUB_NAME if not export_base
                                 else str((output_dir / "base").resolve()))
    vocabulary = max_length = None
    if decoder is None:
        from models import checkpoints
        from tasks import text_run_task

        # The text tasks tokenize with all-MiniLM-L6-v2's WordPiece vocabulary, tiny included.
        folder = checkpoints.fetch_minilm()
        vocabulary = folder / "vocab.txt"
        max_length = (config.task.sequence_length
                      or text_run_task.default_max_length(config.model.backbone, folder))
    peft_export.export_peft(model, output_dir, base_model_name_or_path=base_model,
                            family=family, task_type=task_type, vocabulary=vocabulary,
                            max_seq_length=max_length)
    if export_base:
        cache = None if task is None else task.prefix_cache
        hf_weights.save_base(model, output_dir / "base",
                             prefix=None if cache is None else cache.prefix_model())
        shutil.copy(vocabulary, output_dir / "base" / "vocab.txt")
    record = {"run_dir": str(run_dir), "round": meta["round"], "flags": meta["config"],
              "base_model_name_or_path": base_model, "base_exported": export_base,
              "task_type": task_type}
    if decoder is not None:   # how the training rows were prompted, for scripts/generate.py
        from tasks import instruct_run_task
        from tasks.task_config import TaskConfig

        flags = meta["config"]   # the run's identity: its task, and its training file if any
        record["prompt_style"] = instruct_run_task.prompt_style(
            TaskConfig(task=flags["task"], train_file=flags.get("train_file")))
    (output_dir / EXPORT_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
    return record
