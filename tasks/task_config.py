"""A task's choices, typed: its data and clients (`TaskConfig`), the model trained on it
(`ModelConfig`), and one run's use of both (`TaskSpec`, what `tasks.registry.build_run_task` takes).

`TaskConfig` and `ModelConfig` are two sections of the runner's `runner.run_config.RunConfig`
(each field is `scripts/train.py`'s flag of the same name); `TaskSpec` adds what the run's other
sections decide about the task: the local work drawn per round, the seed, the image tasks' model,
where round data goes and whether a held-out test split is evaluated.

Data sources, by `task`:

| task | data | clients |
|---|---|---|
| `digits`, `mnist` | images (scikit-learn's digits; MNIST from TFDS or `data_dir`) | `partition` |
| `sst2`, `reviews` | GLUE SST-2; five review domains (`data_dir`) | `partition`; domains |
| `sst2_instruct`, `reviews_instruct` | the same, as sentiment prompts for a decoder | as above |
| `text` | `train_file` (+ `dev_file`, `test_file`): CSV, TSV or JSON Lines; or `tfds_name` | `client_column`, else `partition` |
| `instruct` | `train_file` (+ `dev_file`): Alpaca JSON or JSON Lines | `client_column`, else `partition` |

>>> config = TaskConfig(task="text", train_file="reviews.csv", client_column="user")
>>> config.source
'reviews.csv'
>>> ModelConfig(client_ranks=(2, 8)).adapter_rank   # rank unset: the largest client rank
8

Nothing here imports TensorFlow (flags are checked before TensorFlow loads).
"""

from __future__ import annotations

import dataclasses

DEFAULT_RANK = 16  # the adapters' rank when neither `rank` nor `client_ranks` is given
# Tasks whose data a user brings: files (`train_file`, ...) or a TFDS dataset (`tfds_name`).
FILE_TASKS = ("text", "instruct")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The data and how it is split into clients and batches.

    Attributes:
      task: the task's name (module docstring's table).
      data_dir: a folder laid out as ../shared/data (`mnist`, `sst2`, `reviews` and their
        `_instruct` forms); None loads `mnist` and `sst2` through TFDS.
      train_file, dev_file, test_file: `text` and `instruct`: the training rows, the rows
        evaluated every `eval_every` rounds (None: 10 % of the training rows, stratified by
        label, held out) and a held-out test split (evaluated with `eval_test`). CSV (`.csv`),
        TSV (`.tsv`), JSON Lines (`.jsonl`) or, for `instruct`, an Alpaca JSON list (`.json`).
      tfds_name: `text`: a TFDS dataset by name (e.g. "imdb_reviews"), on TFDS's download path,
        instead of files; `tfds_splits` its training, dev and (optional) test splits.
      text_column, text_pair_column, label_column: `text`: the columns (TFDS: features) of the
        text, of an optional second text (sentence pairs, e.g. MNLI's hypothesis) and of the
        label; labels may be any strings (their order: sorted, numerically when all are
        integers).
      client_column: `text` and `instruct`: the column naming each row's client (natural
        clients); None splits the rows by `partition` into `num_clients`.
      partition: "iid", "shards" (`classes_per_client` labels each) or "dirichlet"
        (`dirichlet_alpha`).
      num_clients, batch_size: N, and the examples per local step.
      sequence_length: the most tokens a text keeps (None: every text whole, up to the
        backbone's limit).
      bucket_by_length: batch a round's examples by length, each batch cut to its longest.
    """

    task: str = "digits"
    data_dir: str | None = None
    train_file: str | None = None
    dev_file: str | None = None
    test_file: str | None = None
    tfds_name: str | None = None
    tfds_splits: tuple[str, ...] = ("train", "validation")
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    client_column: str | None = None
    partition: str = "shards"
    classes_per_client: int = 2
    dirichlet_alpha: float = 0.5
    num_clients: int = 5
    batch_size: int = 16
    sequence_length: int | None = None
    bucket_by_length: bool = True

    @property
    def source(self) -> str | None:
        """Where a `FILE_TASKS` task reads its rows: the training file, or "tfds:<name>"."""
        if self.tfds_name is not None:
            return f"tfds:{self.tfds_name}"
        return self.train_file


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model: backbone, classifier, representation and LoRA adapters.

    Attributes:
      backbone: text tasks' encoder ("tiny": a random 2-layer BERT for tests; "minilm") or
        instruction tasks' decoder ("gpt2_tiny": a random byte-level test decoder;
        "gemma3_270m").
      pooling, head: the classifier on an encoder (pooling None: the checkpoint's own).
      representation: the personalized algorithms' representation ("mlp", "lora",
        "lora_alternating").
      rank, client_ranks: the adapters' rank (None: the largest of `client_ranks`, else
        `DEFAULT_RANK`: `adapter_rank`) and heterogeneous client ranks.
      lora_targets, lora_layers, lora_alpha: which projections of which layers get adapters,
        and α (the update is scaled by α/r; None: α = r).
      prefix_cache: compute the frozen layers below the lowest adapter once per example.
      prefix_cache_dtype: the precision those outputs are kept at ("float32"; "float16" holds
        half the memory, and the layers above read them widened back to float32).
      base_dtype: the precision a decoder's frozen weights are stored at ("float32";
        "bfloat16" holds half, "int8" 28% with a float32 scale per 32 inputs of each output channel, read
        widened to float32 in the step: `models.base_precision`).
      frozen_dir: where the frozen-weights file goes.
      init_adapters: a PEFT adapter folder the run starts from.
    """

    backbone: str = "tiny"
    pooling: str | None = None
    head: str = "linear"
    representation: str = "mlp"
    rank: int | None = None
    client_ranks: tuple[int, ...] | None = None
    lora_targets: tuple[str, ...] = ("query", "value")
    lora_layers: tuple[int, ...] | None = None
    lora_alpha: float | None = None
    prefix_cache: bool = True
    prefix_cache_dtype: str = "float32"
    base_dtype: str = "float32"
    frozen_dir: str | None = None
    init_adapters: str | None = None

    @property
    def adapter_rank(self) -> int:
        """The adapters' rank: `rank`, else the largest client rank, else `DEFAULT_RANK`."""
        if self.rank is not None:
            return self.rank
        return max(self.client_ranks) if self.client_ranks else DEFAULT_RANK


# The precisions the text tasks' prefix cache keeps h_k at (`ModelConfig.prefix_cache_dtype`).
PREFIX_CACHE_DTYPES = ("float32", "float16")
# The precisions a decoder's frozen base is stored at (`ModelConfig.base_dtype`;
# `models.base_precision`).
BASE_DTYPES = ("float32", "bfloat16", "int8")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One run's task: its data and model configurations and what the run draws from them.

    Attributes:
      task, model: the `TaskConfig` and `ModelConfig`.
      local_steps: K, the batches each client trains per communication round.
      seed: the seed of partitions, round draws and model initializers.
      net: the image tasks' model (`tasks.registry.MODELS`; text tasks build theirs from
        `model`).
      shortcut_alpha: AdaptPFL's mix weight α of the `pfl_mlp_shortcut` net.
      rounds_on_disk: cached text rounds reach the TFF worker as files (the worker must see
        this machine's temporary folder).
      eval_test: also evaluate the held-out test split (`test_file`, a TFDS test split, or
        SST-2's labeled test split under `data_dir`).
    """

    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    local_steps: int = 10
    seed: int = 0
    net: str = "mlp"
    shortcut_alpha: float = 0.5
    rounds_on_disk: bool = True
    eval_test: bool = False

    def with_changes(self, **changes) -> TaskSpec:
        """This spec with fields changed by name, whichever of `task`, `model` or the spec
        itself holds them (lists become tuples).

        >>> spec = TaskSpec().with_changes(task="sst2", backbone="minilm", seed=3)
        >>> spec.task.task, spec.model.backbone, spec.seed
        ('sst2', 'minilm', 3)
        """
        own = {f.name for f in dataclasses.fields(TaskSpec)} - {"task", "model"}
        sections = {"task": {}, "model": {}, "": {}}
        for name, value in changes.items():
            value = tuple(value) if isinstance(value, list) else value
            section = next((s for s, cls in (("task", TaskConfig), ("model", ModelConfig))
                            if name in {f.name for f in dataclasses.fields(cls)}), None)
            if section is None and name not in own:
                raise ValueError(f"unknown task field {name!r}")
            sections[section or ""][name] = value
        return dataclasses.replace(
            self, task=dataclasses.replace(self.task, **sections["task"]),
            model=dataclasses.replace(self.model, **sections["model"]), **sections[""])
