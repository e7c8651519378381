"""What the benchmark runs: a random BERT-shaped backbone with LoRA and a head (`make_model_fn`),
token-id client datasets (`client_datasets`) and the tffl process per algorithm
(`build_process`), with the sub-rounds each `next` runs."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from benchmarks.config import NUM_CLASSES, XLA_SUFFIX, BackboneShape, BenchmarkConfig
from benchmarks.plain import SubRound, lora_sub_rounds


class Counter:
    """A Python counter bumped by traced code (so it counts traces, not executions)."""

    def __init__(self):
        self.value = 0

    def bump(self) -> None:
        self.value += 1


def make_model_fn(shape: BackboneShape, rank: int, seed: int, calls: Counter
                  ) -> Callable[[], tf.keras.Model]:
    """`() -> classifier`: a random BERT of `shape`, LoRA (rank r) on every layer's query and
    value (base frozen), pooled output -> Dense(2) head tagged `head`. Counts its calls."""

    def keras_model_fn():
        from models import backbones
        from models import hf_bert
        from models import lora_targets

        calls.bump()
        if shape.name == "minilm":
            backbone = hf_bert.bert_backbone_from_config({
                "vocab_size": shape.vocabulary_size, "num_hidden_layers": shape.num_layers,
                "num_attention_heads": shape.num_heads, "hidden_size": shape.hidden_dim,
                "intermediate_size": shape.intermediate_dim,
                "max_position_embeddings": shape.max_sequence_length, "type_vocab_size": 2,
                "hidden_act": "gelu"})
        else:
            backbone = backbones.build_bert_backbone(
                vocabulary_size=shape.vocabulary_size, num_layers=shape.num_layers,
                num_heads=shape.num_heads, hidden_dim=shape.hidden_dim,
                intermediate_dim=shape.intermediate_dim,
                max_sequence_length=shape.max_sequence_length)
        lora_targets.apply_lora(backbone, lora_targets.LoraConfig(
            rank=rank, targets=("query", "value"), seed=seed))
        return backbones.build_classifier(backbone, NUM_CLASSES, seed=seed)

    return keras_model_fn


def input_spec(sequence_length: int):
    x = collections.OrderedDict(
        (k, tf.TensorSpec([None, sequence_length], tf.int32))
        for k in ("padding_mask", "segment_ids", "token_ids"))
    return (x, tf.TensorSpec([None], tf.int32))


def client_datasets(num_clients: int, config: BenchmarkConfig, vocabulary_size: int
                    ) -> list[tf.data.Dataset]:
    """Synthetic token data: client i has `local_steps` batches of random token ids in
    [1, vocabulary_size), a full padding mask, segment 0 and random labels in {0, 1}."""
    out = []
    n = config.local_steps * config.batch_size
    for i in range(num_clients):
        rng = np.random.default_rng([config.seed, i])
        x = collections.OrderedDict(
            padding_mask=np.ones((n, config.sequence_length), np.int32),
            segment_ids=np.zeros((n, config.sequence_length), np.int32),
            token_ids=rng.integers(1, vocabulary_size, (n, config.sequence_length),
                                   dtype=np.int32))
        y = rng.integers(0, NUM_CLASSES, n, dtype=np.int32)
        out.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(config.batch_size))
    return out


@dataclasses.dataclass
class Built:
    """A built TFF process and what the plain loop needs to do the same work."""

    algorithm: str
    backbone: BackboneShape
    process: object
    sub_rounds: tuple[SubRound, ...]
    personal: tuple[int, ...]  # fedrep: positions of the personal head
    traffic: dict  # {sub-round: RoundTraffic}
    model_fn_calls: Counter
    model_fn: Callable[[], tf.keras.Model]
    build_seconds: float

    @property
    def personalized(self) -> bool:
        return bool(self.personal)


def build_process(algorithm: str, shape: BackboneShape, config: BenchmarkConfig) -> Built:
    """The TFF process of `algorithm` on `shape`, its per-client traffic and its sub-rounds."""
    from tffl.algorithms import lora_fl
    from tffl.algorithms import personalized
    from tffl.algorithms import personalized_builders
    from tffl.engine import roles

    calls = Counter()
    model_fn = make_model_fn(shape, config.rank, config.seed, calls)
    spec_in = input_spec(config.sequence_length)
    started = time.perf_counter()
    name = algorithm.removesuffix(XLA_SUFFIX)
    jit_compile = name != algorithm
    if name == "fedrep":
        process = personalized.build_personalized_process(
            "fedrep", model_fn, spec_in, config.learning_rate, head_epochs=config.head_epochs,
            representation_epochs=1, jit_compile=jit_compile)
        spec = process.spec
        head = spec.indices([roles.HEAD])
        rep = spec.indices(personalized_builders.REPRESENTATION_ROLES)
        sub_rounds = (SubRound("round", ((head, config.head_epochs), (rep, 1)), rep),)
        traffic = dict(process.traffic)
        personal = tuple(process.evaluation.personal_indices)
    else:
        process = lora_fl.build_lora_process(name, model_fn, spec_in, config.learning_rate,
                                             jit_compile=jit_compile)
        sub_rounds = lora_sub_rounds(process.spec, name)
        traffic = lora_fl.traffic_per_communication_round(process)
        personal = ()
    if [s.name for s in sub_rounds] != list(traffic):
        raise RuntimeError(f"{algorithm}: sub-rounds {list(traffic)} are not the expected "
                           f"{[s.name for s in sub_rounds]}")
    return Built(algorithm, shape, process, sub_rounds, personal, traffic, calls, model_fn,
                 time.perf_counter() - started)
