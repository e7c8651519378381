"""The benchmark's settings: backbone shapes, algorithms and `BenchmarkConfig`, and `TargetsConfig` of
`--suite=targets` (no TensorFlow import, so `scripts/benchmark.py` checks its flags before paying
for TensorFlow)."""

from __future__ import annotations

import dataclasses


BENCHMARKED_ALGORITHMS = ("rolora", "fedavg_lora", "fedrep")
# "<algorithm>+xla": the same process with its client step XLA-compiled inside the client
# computation (`jit_compile=True`), to compare against the plain one in the same run.
XLA_SUFFIX = "+xla"
NUM_CLASSES = 2
# The default suite's targets: TFF's overhead over the plain loop (a small BERT, 10 clients ×
# 20 steps) and the peak memory's growth with the clients per round.
TARGET_OVERHEAD = 1.25
GOAL_OVERHEAD = 1.10
TARGET_MEMORY_RATIO = 1.5


@dataclasses.dataclass(frozen=True)
class BackboneShape:
    """A BERT shape (random weights): `minilm` has all-MiniLM-L6-v2's shapes."""

    name: str
    num_layers: int
    num_heads: int
    hidden_dim: int
    intermediate_dim: int
    vocabulary_size: int = 30522
    max_sequence_length: int = 512

    def describe(self) -> str:
        return (f"L={self.num_layers} H={self.hidden_dim} A={self.num_heads} "
                f"I={self.intermediate_dim} V={self.vocabulary_size}")


BACKBONES = {
    # scripts/registry.py's "tiny" random BERT.
    "tiny": BackboneShape("tiny", num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128),
    # BERT-Mini (Turc et al. 2019): the "small BERT" of the overhead target.
    "small": BackboneShape("small", num_layers=4, num_heads=4, hidden_dim=256,
                           intermediate_dim=1024),
    # all-MiniLM-L6-v2 (models/hf_bert.py), random weights.
    "minilm": BackboneShape("minilm", num_layers=6, num_heads=12, hidden_dim=384,
                            intermediate_dim=1536),
}


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """Everything `run_benchmark` needs (the flags, parsed). See the module docstring."""

    backbones: tuple[str, ...] = ("tiny",)
    clients_per_round: tuple[int, ...] = (5, 20)
    algorithms: tuple[str, ...] = BENCHMARKED_ALGORITHMS
    local_steps: int = 5
    rounds: int = 3
    batch_size: int = 8
    sequence_length: int = 32
    rank: int = 4
    learning_rate: float = 0.05
    head_epochs: int = 1
    jit_compile: bool = False
    profile: bool = False
    seed: int = 0
    # Clients a TFF worker trains at once (None: tffl.runtime's default, one per core; <= 0:
    # unlimited, TFF's own default).
    max_concurrent_calls: int | None = None


# ------------------------------------------------------------------------------------------------
# `--suite=targets` (benchmarks/targets.py): its targets and its fixed setting.

TARGETS = {"round_time_vs_previous_path": 1 / 3, "round_time_vs_plain_uncached": 0.5,
           "cpu_vs_plain_cached": 1.05, "state_io_seconds": 0.05, "memory_200_vs_10": 1.5,
           "evaluation_seconds": 60.0, "round_time_vs_baseline": 1.1}
# `--suite=targets`' parts (`--targets_parts`); the default runs the first three.
TARGETS_PARTS = ("scaling", "main", "large", "evaluation", "startup", "peer", "baseline")
# The peer part's models (benchmarks/peer.py's PEER_SETTINGS).
PEER_MODELS = ("minilm", "gemma3_270m")
# The start-up part's models (benchmarks/startup.py's STARTUP_SETTINGS).
STARTUP_MODELS = ("gemma3_270m", "minilm")
LARGE_MEMORY_LIMIT_MB = 24 * 1024


@dataclasses.dataclass(frozen=True)
class TargetsConfig:
    """The settings of `--suite=targets` (see benchmarks/targets.py)."""

    data_dir: str = "../shared/data"
    num_clients: int = 10
    local_steps: int = 20
    batch_size: int = 16
    sequence_length: int = 32
    rank: int = 4
    lora_layers: tuple[int, ...] = (3, 4, 5)
    learning_rate: float = 0.05
    rounds: int = 3  # communication rounds per path and algorithm; round 1 is not averaged
    algorithms: tuple[str, ...] = ("rolora", "fedavg_lora")
    scaling_clients: tuple[int, int] = (10, 200)
    large_layers: tuple[int, ...] = tuple(range(18, 24))
    seed: int = 0
    devices: str = ""  # the in-process runtime's devices (default: the GPUs, else the CPU)
    parts: tuple[str, ...] = ("scaling", "main", "large")
    # The peer part's Python: one with torch, transformers and peft, and its models.
    peer_python: str = ""
    peer_models: tuple[str, ...] = PEER_MODELS
    startup_models: tuple[str, ...] = STARTUP_MODELS
    # The baseline part's other checkout (a clone at the commit compared with).
    baseline_checkout: str = ""
