"""A training run's choices, typed: `RunConfig`, six dataclasses of one job each (the task's
and the model's are `tasks.task_config`'s `TaskConfig` and `ModelConfig`).

`scripts/train.py`'s flags fill a `RunConfig` (each field is the flag of the same name), the
experiments build one in Python, and `runner.run.run(config)` runs it in this process. Its
defaults are the flags' defaults: this module is their one place. `config.json` in every run
folder holds `config.to_json()`; `RunConfig.from_json` reads it back and `config.command()` is
the train.py command line that reruns it.

>>> config = RunConfig().with_changes(algorithm=("rolora",), rounds=3, learning_rate=0.1)
>>> config.algorithm.rounds, config.algorithm.learning_rate, config.task.task
(3, 0.1, 'digits')
>>> config.command()
'python scripts/train.py --algorithm=rolora --rounds=3 --learning_rate=0.1'
>>> RunConfig.from_json(config.to_json()) == config
True
>>> config.model.adapter_rank   # --rank unset: 16, or the largest of --client_ranks
16

Nothing here imports TensorFlow or absl (flags are checked before TensorFlow loads).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any

from tasks.task_config import DEFAULT_RANK
from tasks.task_config import ModelConfig
from tasks.task_config import TaskConfig


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithms compared, their optimizers and their local work, for `rounds`
    communication rounds of `local_steps` batches per client."""

    algorithm: tuple[str, ...] = ("rolora", "fedavg_lora", "ffa_lora")
    rounds: int = 100
    local_steps: int = 10
    learning_rate: float = 0.5
    client_optimizer: str = "sgd"
    client_momentum: float = 0.0
    weight_decay: float = 0.0
    server_optimizer: str = "sgd"
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0
    seed: int = 0
    rolora_fraction: float = 0.5
    averaging_error: bool = True
    local_epochs: int = 1
    head_epochs: int = 10
    representation_blocks: int = 1
    representation_epochs: int = 1
    finetune_epochs: int | None = None
    shortcut_epochs: int = 1
    shortcut_alpha: float = 0.5
    adaptpfl_variant: str = "a"
    adaptpfl_order: str | None = None
    shortcut_ridge: float = 0.0
    project_shortcut: bool = True
    shortcut_damping: float = 1.0
    head_damping: float = 1.0
    flute_feature_penalty: float = 0.005
    flute_head_penalty: float = 0.0025
    flute_nc_penalty: float = 0.25
    flute_nc_step: float = 0.5
    flute_variant: str = "star"
    flute_final_head_epochs: int = 0
    flute_feature_reduction: str = "mean"


@dataclasses.dataclass(frozen=True)
class ParticipationConfig:
    """Which clients train each round (`runner.algorithms.build_sampler`).

    `stage_rounds`: SRPFL's rounds per stage, an integer or "lemma_b1"."""

    participation: str = "uniform"
    clients_per_round: int = 5
    initial_participants: int = 2
    srpfl_pool: int = 0
    stage_rounds: int | str = 10
    straggler: str = "fixed"
    communication_cost: float = 0.0


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Where the TFF computations run (`tffl.runtime`)."""

    runtime: str = "tff"
    workers: int = 1
    worker_addresses: tuple[str, ...] | None = None
    worker_timeout: float = 60.0
    devices: str = ""
    logical_cpus: int = 0
    # None: the model's (`runner.run.graph_optimization`).
    graph_optimization: str | None = None
    # Clients each local TFF worker trains at once; None: the model's
    # (`runner.run.max_concurrent_calls`).
    max_concurrent_calls: int | None = None


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """Where results go, how often the run evaluates and checkpoints, and what it evaluates.

    `output_dir` None: a fresh runs/<task>-<algorithms>-<time>."""

    output_dir: str | None = None
    resume: bool = False
    evaluate_only: bool = False
    eval_every: int = 5
    checkpoint_every: int = 1
    eval_test: bool = False
    eval_per_client: bool = False


# The flags that change only what a run evaluates, never what it trains: a checkpoint may be
# evaluated (train.py --evaluate_only) and a run repeated (`runner.archive.attach_rerun`) with
# other values, e.g. --eval_test added to a run trained without it.
EVALUATION_FLAGS = ("eval_test", "eval_per_client")

# config.json's record of the code and machine that ran it (`runner.machine.provenance`):
# beside the sections, not a part of the configuration.
PROVENANCE = "provenance"
SECTIONS = {"task": TaskConfig, "model": ModelConfig, "algorithm": AlgorithmConfig,
            "participation": ParticipationConfig, "runtime": RuntimeConfig,
            "output": OutputConfig}
# Each field's section: field names are unique across sections (and are train.py's flags).
SECTION_OF = {f.name: section for section, cls in SECTIONS.items()
              for f in dataclasses.fields(cls)}
# Fields held as tuples (flags: comma-separated lists); of integers for the second set.
_TUPLES = {"algorithm", "lora_targets", "worker_addresses", "lora_layers", "client_ranks",
           "tfds_splits"}
_INT_TUPLES = {"lora_layers", "client_ranks"}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every choice of a training run (see the module docstring)."""

    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    participation: ParticipationConfig = ParticipationConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    output: OutputConfig = OutputConfig()

    def get(self, name: str) -> Any:
        """The value of the field (flag) `name`, from whichever section holds it."""
        return getattr(getattr(self, _section(name)), name)

    def with_changes(self, **changes: Any) -> RunConfig:
        """This configuration with fields (by flag name) changed; lists become tuples."""
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            by_section.setdefault(_section(name), {})[name] = _typed(name, value)
        return dataclasses.replace(self, **{
            s: dataclasses.replace(getattr(self, s), **fields) for s, fields in by_section.items()})

    def items(self) -> list[tuple[str, Any]]:
        """(flag name, value) of every field, section by section."""
        return [(f.name, getattr(getattr(self, s), f.name))
                for s in SECTIONS for f in dataclasses.fields(SECTIONS[s])]

    def changed(self) -> set[str]:
        """The fields whose value is not the default (the flags a command line would give)."""
        default = RunConfig()
        return {name for name, value in self.items() if value != default.get(name)}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """{section: {field: value}}, JSON-ready (tuples as lists)."""
        return {s: {k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(getattr(self, s)).items()} for s in SECTIONS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> RunConfig:
        """The inverse of `to_dict`; a missing field takes its default, an unknown section or
        field raises `ValueError` naming it (config.json's `PROVENANCE` record is no section:
        it is left out)."""
        data = {k: v for k, v in data.items() if k != PROVENANCE}
        for section in data:
            if section not in SECTIONS:
                where = (f"; field {section!r} belongs in section {SECTION_OF[section]!r}"
                         if section in SECTION_OF else "")
                raise ValueError(f"run configuration: unknown section {section!r}{where}; "
                                 f"expected {', '.join(SECTIONS)}, each mapping its fields to "
                                 "values")
        for section, fields in data.items():
            if not isinstance(fields, Mapping):
                raise ValueError(f"run configuration: section {section!r} must map its fields "
                                 f"to values, got a {type(fields).__name__}")
            for name in fields:
                if SECTION_OF.get(name) != section:
                    raise ValueError(f"run configuration: unknown field {section}.{name}")
        config = cls().with_changes(**{k: v for fields in data.values() for k, v in fields.items()})
        for name, value in config.items():
            _check_type(name, value)
        return config

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_flag_values(cls, values: Mapping[str, Any]) -> RunConfig:
        """From train.py's flag values by name (lists of strings, and "rank_present": whether
        --rank was given), as `runner.train_flags.options` returns them."""
        fields = {name: values[name] for name in SECTION_OF}
        if not values.get("rank_present", True):
            fields["rank"] = None
        return cls().with_changes(**fields)

    def flag_values(self) -> dict[str, Any]:
        """The inverse of `from_flag_values`: every flag's value as absl holds it."""
        values = {name: _as_flag(value) for name, value in self.items()}
        values["stage_rounds"] = str(self.participation.stage_rounds)
        values["rank"] = DEFAULT_RANK if self.model.rank is None else self.model.rank
        values["rank_present"] = self.model.rank is not None
        return values

    def command(self, script: str = "scripts/train.py") -> str:
        """The train.py command line that runs this configuration (its non-default flags)."""
        changed = self.changed()
        args = [_flag_arg(name, value) for name, value in self.items() if name in changed]
        return shlex.join(["python", script, *args])


# The types a field may hold, by its section's annotation (None is allowed where it says so).
_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(name: str, value: Any) -> None:
    """ValueError naming the field if `value` is not of its annotated type (e.g. a config file
    holding "rounds": "x")."""
    annotation = next(f.type for f in dataclasses.fields(SECTIONS[SECTION_OF[name]])
                      if f.name == name)
    kinds = [k.strip() for k in str(annotation).split("|")]
    if value is None:
        if "None" in kinds:
            return
    elif isinstance(value, tuple):
        inner = int if name in _INT_TUPLES else str
        if any(k.startswith("tuple") for k in kinds) and all(
                isinstance(v, inner) and not isinstance(v, bool) for v in value):
            return
    else:
        allowed = tuple(t for k in kinds for t in _TYPES.get(k, ()))
        if isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool)):
            return
    raise ValueError(f"run configuration: {name}={value!r} is not of type {annotation}")


def _section(name: str) -> str:
    try:
        return SECTION_OF[name]
    except KeyError:
        raise ValueError(f"run configuration: unknown field {name!r}") from None


def _typed(name: str, value: Any) -> Any:
    """A flag's value as the field holds it (tuples; integers where the field has them)."""
    if name in _TUPLES and value is not None:
        if isinstance(value, str):
            value = value.split(",")
        try:
            return tuple(int(v) for v in value) if name in _INT_TUPLES else tuple(value)
        except (TypeError, ValueError):
            raise ValueError(f"run configuration: {name}={value!r} is not a list of "
                             f"{'integers' if name in _INT_TUPLES else 'names'}") from None
    if name == "stage_rounds" and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _as_flag(value: Any) -> Any:
    """A field's value as absl holds its flag (lists of strings)."""
    return [str(v) for v in value] if isinstance(value, tuple) else value


def _flag_arg(name: str, value: Any) -> str:
    """`--name=value` as absl parses it (`--name`/`--noname` for booleans)."""
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no{name}"
    if isinstance(value, tuple):
        return f"--{name}={','.join(map(str, value))}"
    if value is None:
        raise ValueError(f"run configuration: {name}=None has no command-line form (the flag's "
                         "default is not None)")
    return f"--{name}={value}"
