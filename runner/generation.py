"""Text from a trained decoder: greedy continuations of prompts by an instruction run's model, or
by a decoder with the LoRA adapters of an exported PEFT folder (`scripts/generate.py`).

- `generate_from_run(run_dir, prompts)`: the run's model rebuilt from its newest checkpoint
  (`runner.trained_run.trained_model`) for a run of an instruction task (`sst2_instruct`,
  `reviews_instruct`, `instruct`); a classifier's run is refused before anything is built.
- `generate_from_peft(peft_dir, prompts)`: a PEFT `CAUSAL_LM` folder (`scripts/export_adapters.py`
  writes one for a gemma3_270m run): the pretrained decoder its `adapter_config.json` names as
  the base (`models.decoders.HUB_NAMES`: google/gemma-3-270m is gemma3_270m), LoRA where the
  folder's adapters sit (`models.peft_export.folder_lora_config`) and their values
  (`init_adapters`).

Both continue every prompt greedily, stopping at end of text or after `max_new_tokens`
(`models.decoders.generate_text`: begin of text, the prompt's tokens, the argmax token of each
step). A bare prompt (`Prompts.texts`) is prompted as the run's training rows were
(`prompt_style`): an `instruct` run on Alpaca rows with Alpaca's template (and the prompt's
`inputs`), one on prompt/response rows as written, an `sst2_instruct` / `reviews_instruct`
run as a review (`tasks.instructions.SENTIMENT_PROMPT`); a PEFT folder by the task its
`export.json` records, as written without one. `Prompts(..., as_written=True)` skips the template,
and the rows of a prompts file (`read_prompts`: JSON Lines, an Alpaca JSON list, CSV, TSV) are
prompted as training rows are (`tasks.data_files.read_instruction_rows`).

Every problem is a one-line `ValueError` (a run or folder that cannot generate, an empty prompt,
an input for a run whose prompts have none). Example (the prompts alone; the generation runs a
trained model):

>>> prompts = Prompts(("Add the numbers.",), inputs=("2 and 3",))
>>> print(model_prompts(prompts, "alpaca")[0].splitlines()[-4:])
['### Input:', '2 and 3', '', '### Response:']
>>> Prompts(("Add the numbers.", " "))
Traceback (most recent call last):
...
ValueError: prompt 2 is empty
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from runner import trained_run
from runner.export import EXPORT_FILE


@dataclasses.dataclass(frozen=True)
class Prompts:
    """What to generate from.

    Attributes:
      texts: the prompts (an instruction, a review, a prompt), none of them blank.
      inputs: Alpaca's input of each text ("" for none; Alpaca runs only), or () for none.
      as_written: the texts are what the model reads, as they are (no template).
      references: each text's reference answer ("" for none; `read_prompts`), or ().
    """

    texts: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    as_written: bool = False
    references: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("texts", "inputs", "references"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.texts:
            raise ValueError("no prompts: give at least one")
        blank = [i for i, t in enumerate(self.texts) if not t.strip()]
        if blank:
            raise ValueError(f"prompt {blank[0] + 1} is empty")
        for name in ("inputs", "references"):
            values = getattr(self, name)
            if values and len(values) != len(self.texts):
                raise ValueError(f"{len(values)} {name} for {len(self.texts)} prompts: give "
                                 f"one per prompt (\"\" for none)")
        if self.as_written and any(i.strip() for i in self.inputs):
            raise ValueError("inputs go into Alpaca's template; prompts as written have none")


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """How to generate: at most `max_new_tokens` tokens per prompt, `batch_size` prompts a
    step; `data_dir` / `frozen_dir` replace a run's recorded ones (as scripts/train.py's)."""

    max_new_tokens: int = 64
    batch_size: int = 8
    data_dir: str | None = None
    frozen_dir: str | None = None

    def __post_init__(self):
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")


@dataclasses.dataclass(frozen=True)
class Generation:
    """One prompt's result: the text the model read (after any template; begin of text not
    shown), its greedy continuation and the reference answer, when the prompt came with one."""

    prompt: str
    continuation: str
    reference: str | None = None


@dataclasses.dataclass(frozen=True)
class Generations:
    """The results in prompt order, what generated them (`source`, in words) and how bare
    prompts were prompted (`style`: `tasks.instructions.PROMPT_STYLES`)."""

    source: str
    style: str
    items: tuple[Generation, ...]


def read_prompts(path: str | pathlib.Path) -> Prompts:
    """The prompts of a file: a file of rows (`.json`, `.jsonl`, `.csv`, `.tsv`: Alpaca's
    `instruction` (+ `input`) or a `prompt`, optionally with their answers as references) is
    read by `tasks.data_files.read_instruction_rows`, its Alpaca rows prompted with Alpaca's
    template as training rows are (`as_written`); any other file holds one bare prompt per line
    (blank lines skipped), prompted as the run's rows were."""
    from tasks import data_files

    path = pathlib.Path(path)
    if path.suffix.lower() in data_files.FORMATS:
        rows = data_files.read_instruction_rows(path, require_responses=False)
        return Prompts(rows.prompts, as_written=True, references=rows.responses)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no prompts (one per line)")
    return Prompts(tuple(lines))


def model_prompts(prompts: Prompts, style: str) -> list[str]:
    """The texts the model reads: `prompts.texts` in `style` (`tasks.instructions.styled_prompt`
    with each input), or as they are when `as_written`. Style "mixed" (a run trained on rows of
    both forms) takes prompts as written only."""
    from tasks import instructions

    if prompts.as_written:
        return list(prompts.texts)
    if style == "mixed":
        raise ValueError("the run's training rows mix Alpaca's form and prompt/response rows, "
                         "so a bare prompt has no one template: give the prompts as written")
    inputs = prompts.inputs or ("",) * len(prompts.texts)
    out = []
    for k, (text, extra) in enumerate(zip(prompts.texts, inputs), start=1):
        try:
            out.append(instructions.styled_prompt(style, text, extra))
        except ValueError as e:
            raise ValueError(f"prompt {k}: {e}") from None
    return out


def _results(prompts: Prompts, texts: list[str], continuations: list[str], source: str,
             style: str) -> Generations:
    references = prompts.references or ("",) * len(texts)
    return Generations(source, style, tuple(
        Generation(t, c, r or None) for t, c, r in zip(texts, continuations, references)))


def _check_decoder_run(run_dir: pathlib.Path, recorded: dict) -> None:
    """A one-line ValueError unless the run trained a decoder language model."""
    from models import decoders
    from tasks import instruct_run_task

    task, backbone = recorded.get("task"), recorded.get("backbone")
    if task not in instruct_run_task.INSTRUCT_TASKS or backbone not in decoders.DECODERS:
        raise ValueError(f"run_dir={run_dir}: task {task!r} on backbone {backbone!r} is not a "
                         "decoder language model; generation needs a run of "
                         f"{', '.join(instruct_run_task.INSTRUCT_TASKS)} on "
                         f"{' or '.join(decoders.DECODERS)}")


def generate_from_run(run_dir: str | pathlib.Path, prompts: Prompts,
                      options: GenerationOptions = GenerationOptions()) -> Generations:
    """The greedy continuation of every prompt by the model of the instruction run in `run_dir`
    (its newest checkpoint), each bare prompt prompted as the run's training rows were (module
    docstring). A folder that is no such run, or prompts the run cannot take, are a one-line
    `ValueError`, raised before the model is built."""
    from models import causal_lm
    from models import decoders
    from tasks import instruct_run_task

    run_dir = pathlib.Path(run_dir)
    _, meta = trained_run.newest_checkpoint(run_dir)
    _check_decoder_run(run_dir, meta["config"])
    config = trained_run.run_config(run_dir, meta["config"], options.data_dir,
                                    options.frozen_dir)
    train_file = config.task.train_file
    if train_file is not None and not pathlib.Path(train_file).is_file():
        raise ValueError(f"run_dir={run_dir}: the run's train_file {train_file} is not there "
                         "(the task is rebuilt from it; a relative path is read from the folder "
                         "the run was trained in: generate from there)")
    style = "as_written" if prompts.as_written else instruct_run_task.prompt_style(config.task)
    texts = model_prompts(prompts, style)
    run = trained_run.trained_model(run_dir, options.data_dir, options.frozen_dir)
    continuations = decoders.generate_text(causal_lm.backbone_of(run.model), run.task.decoder,
                                           texts, options.max_new_tokens, options.batch_size)
    source = (f"round {run.meta['round']} of {run_dir} ({meta['config']['algorithm']}, "
              f"{config.task.task} on {config.model.backbone})")
    return _results(prompts, texts, continuations, source, style)


def _peft_decoder_name(peft_dir: pathlib.Path, adapter_config: dict) -> str:
    """The tffl decoder of a CAUSAL_LM folder's base model (a one-line ValueError otherwise)."""
    from models import decoders
    from models import peft_names

    task_type = adapter_config.get("task_type")
    if task_type != peft_names.CAUSAL_LM:
        raise ValueError(f"peft_dir={peft_dir}: a {task_type} folder (a classifier's or an "
                         f"encoder's adapters); generation needs the {peft_names.CAUSAL_LM} "
                         "adapters of a decoder")
    base = adapter_config.get("base_model_name_or_path")
    by_hub = {hub: name for name, hub in decoders.HUB_NAMES.items()}
    if base not in by_hub:
        raise ValueError(f"peft_dir={peft_dir}: base model {base!r} is no tffl decoder; "
                         "generation from a PEFT folder covers " + ", ".join(
                             f"{hub} ({name})" for name, hub in decoders.HUB_NAMES.items()))
    return by_hub[base]


def _peft_style(peft_dir: pathlib.Path) -> str:
    """The prompt style of the run a folder was exported from (its `export.json`'s
    `prompt_style`; for exports that predate it, the sentiment tasks' template by their task),
    else "as_written"."""
    record = peft_dir / EXPORT_FILE
    exported = json.loads(record.read_text()) if record.is_file() else {}
    if "prompt_style" in exported:
        return exported["prompt_style"]
    task = exported.get("flags", {}).get("task")
    return "sentiment" if task in ("sst2_instruct", "reviews_instruct") else "as_written"


def generate_from_peft(peft_dir: str | pathlib.Path, prompts: Prompts,
                       options: GenerationOptions = GenerationOptions()) -> Generations:
    """The greedy continuation of every prompt by the pretrained decoder a PEFT CAUSAL_LM
    folder names as its base, with the folder's LoRA adapters (module docstring). A folder of
    another form or base is a one-line `ValueError`, raised before the decoder is loaded."""
    from models import decoders
    from models import peft_export
    from models.lora_targets import apply_lora

    peft_dir = pathlib.Path(peft_dir)
    config_file = peft_dir / peft_export.ADAPTER_CONFIG
    if not config_file.is_file():
        raise ValueError(f"peft_dir={peft_dir}: no {peft_export.ADAPTER_CONFIG} there (a folder "
                         "written by scripts/export_adapters.py)")
    adapter_config = json.loads(config_file.read_text())
    name = _peft_decoder_name(peft_dir, adapter_config)
    style = "as_written" if prompts.as_written else _peft_style(peft_dir)
    texts = model_prompts(prompts, style)
    lora = peft_export.folder_lora_config(peft_dir)
    decoder = decoders.build_decoder(name)
    backbone = decoder.pretrained_fn()
    apply_lora(backbone, lora)
    peft_export.init_adapters(backbone, peft_dir)
    continuations = decoders.generate_text(backbone, decoder, texts, options.max_new_tokens,
                                           options.batch_size)
    source = (f"{peft_dir} (LoRA r={lora.rank} on {','.join(lora.targets)} of layers "
              f"{','.join(map(str, lora.layers))}, base {adapter_config['base_model_name_or_path']}"
              f" as {name})")
    return _results(prompts, texts, continuations, source, style)


def write_json_lines(generations: Generations, path: str | pathlib.Path) -> None:
    """One JSON object per prompt: `prompt` (the text the model read), `continuation` and, when
    known, `reference`."""
    lines = [json.dumps({k: v for k, v in dataclasses.asdict(g).items() if v is not None},
                        ensure_ascii=False) for g in generations.items]
    pathlib.Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
