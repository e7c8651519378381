"""`--suite=targets`'s peer part (benchmarks/targets.py): tffl beside the library its users would
otherwise pick, Hugging Face Transformers + PEFT in a FedAvg loop, on the same batches.

For each model of `TargetsConfig.peer_models` (`PEER_SETTINGS`) and each N of `PEER_CLIENTS`,
one after the other:

1. tffl: `runner.run.run` (what scripts/train.py runs) trains FedAvg-LoRA with N IID clients,
   all of them every round, for `PEER_ROUNDS` rounds on its default path (the TFF worker; for
   MiniLM the frozen layers' outputs cached), at the model's experiment protocol:
   - `minilm`: SST-2 on the pretrained all-MiniLM-L6-v2, LoRA r = 4, α = r, on query and value of
     layers 3-5, mean pooling, a linear head, 10 SGD steps of batch 16 (experiment 1);
   - `gemma3_270m`: `sst2_instruct` on Gemma 3 270M, LoRA r = 8 on query and value of layers
     14-17, the loss on the answer tokens, 2 SGD steps of batch 8 (its budget).
   Sentences are whole and batches bucketed by length. From its metrics.csv: each round's
   seconds and the driver's and the worker's peak resident memory (`tffl.simulation.memory`).
2. The same run's batches: the task built again (without the cached prefix) hands out, for each
   round and client, the token batches tffl trained on (the same examples in the same order;
   the cache changes what a batch carries, not which examples). They go to
   `<output_dir>/peer_<model>_<N>/peft/batches.npz` with `setting.json`.
3. The peer: `benchmarks/peft_loop.py`, run by `TargetsConfig.peer_python` (a Python with torch,
   transformers and peft; tffl's environment has none of them), trains the same model from the
   same weights (MiniLM's checkpoint folder; Gemma's GGUF written as HF's checkpoint,
   `models.gguf_checkpoint.save_hf_checkpoint`) on those batches and writes `peft.json`.

Reported per model and N: each side's seconds per client step (the mean of rounds 2.. over the
client steps of a round; round 1 holds tffl's compilation), its peak memory (tffl: driver +
worker), and `seconds_ratio` and `memory_ratio`, tffl's over the peer's. tffl's run evaluates
the dev set once, after its last round, and the peer's loop evaluates nothing, so tffl's peak
before that evaluation is reported too, with `training_memory_ratio` (`tffl_measures`).
tffl's driver prepares round t + 1's data while round t runs (`tffl.simulation.driver`); with
the cached prefix that includes computing h_k of every example the round sees for the first
time, so rounds 2..R-1 share the cores with it and the last round does not: its figure is
reported apart (`last_round_seconds_per_client_step`), with each round's `data_seconds`.
Without a peer Python the part says how to make one and reports `{"skipped": reason}`.

>>> PEER_SETUP.split(" && ")[0]
'python3 -m venv /tmp/hf'
>>> sorted(PEER_SETTINGS)
['gemma3_270m', 'minilm']
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess

import numpy as np

from benchmarks.config import TargetsConfig

PEER_CLIENTS = (3, 20)
PEER_ROUNDS = 5
PEER_ALGORITHM = "fedavg_lora"
PEER_SETUP = "python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers peft safetensors"
PEFT_LOOP = pathlib.Path(__file__).with_name("peft_loop.py")


@dataclasses.dataclass(frozen=True)
class PeerSetting:
    """One model's protocol (module docstring): the tffl run's task and LoRA, the clients' work,
    and the peer's model family (`peft_loop.py`: "bert" or "gemma3")."""

    task: str
    family: str
    rank: int
    layers: tuple[int, ...]
    local_steps: int
    batch_size: int
    learning_rate: float


PEER_SETTINGS = {
    "minilm": PeerSetting("sst2", "bert", 4, (3, 4, 5), local_steps=10, batch_size=16,
                          learning_rate=0.05),
    "gemma3_270m": PeerSetting("sst2_instruct", "gemma3", 8, (14, 15, 16, 17), local_steps=2,
                               batch_size=8, learning_rate=0.1),
}


def peer_python_problem(python: str) -> str | None:
    """Why `python` cannot run the peer (None: it can): unset, missing, or lacking a module."""
    if not python:
        return "no --peer_python was given"
    if not pathlib.Path(python).exists():
        return f"--peer_python={python} does not exist"
    check = subprocess.run([python, "-c", "import peft, torch, transformers"],
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines() or ["(no message)"]
        return f"--peer_python={python} cannot import torch, transformers and peft: {lines[-1]}"
    return None


def peer_run_config(config: TargetsConfig, model: str, clients: int, folder: pathlib.Path):
    """The tffl run of `model` with N = `clients` (module docstring), a
    `runner.run_config.RunConfig`."""
    from runner.run_config import RunConfig

    setting = PEER_SETTINGS[model]
    return RunConfig().with_changes(
        task=setting.task, backbone=model, data_dir=config.data_dir, algorithm=(PEER_ALGORITHM,),
        rank=setting.rank, lora_targets=("query", "value"), lora_layers=setting.layers,
        partition="iid", num_clients=clients, clients_per_round=clients, rounds=PEER_ROUNDS,
        local_steps=setting.local_steps, batch_size=setting.batch_size,
        learning_rate=setting.learning_rate, eval_every=PEER_ROUNDS, seed=config.seed,
        output_dir=str(folder))


def export_batches(run_config, path: pathlib.Path) -> tuple[int, int]:
    """Writes the token batches of `run_config`'s rounds to `path` (npz, keys
    `r<round>_c<client index>_s<step>_<feature>`, the batch's features and `labels`, its
    targets); returns (clients, steps per client)."""
    from runner import training

    task = training.run_task_for(PEER_ALGORITHM, run_config.with_changes(prefix_cache=False))
    arrays, steps = {}, set()
    for round_num in range(1, PEER_ROUNDS + 1):
        for index, cid in enumerate(task.client_ids):
            batches = list(task.client_dataset_fn(cid, round_num).as_numpy_iterator())
            steps.add(len(batches))
            for step, (features, labels) in enumerate(batches):
                prefix = f"r{round_num}_c{index}_s{step}_"
                for key, value in features.items():
                    arrays[prefix + key] = np.asarray(value)
                arrays[prefix + "labels"] = np.asarray(labels)
    np.savez(path, **arrays)
    (count,) = steps
    return len(task.client_ids), count


def peer_checkpoint(model: str, output_dir: pathlib.Path) -> pathlib.Path:
    """The folder the peer loads `model` from: MiniLM's checkpoint; Gemma 3 270M's GGUF file
    written as HF's checkpoint into `output_dir/gemma3_270m_hf` (once)."""
    from models import checkpoints, gguf_checkpoint

    if model == "minilm":
        return checkpoints.fetch_minilm()
    folder = output_dir / "gemma3_270m_hf"
    if not (folder / "config.json").exists():
        gguf_checkpoint.save_hf_checkpoint(gguf_checkpoint.fetch_gemma3_270m(), folder)
    return folder


def _steady_per_step(round_seconds: list[float], client_steps: int) -> float:
    steady = round_seconds[1:]
    return sum(steady) / len(steady) / client_steps


def tffl_measures(rows: list[dict], client_steps: int) -> dict:
    """tffl's side of one comparison, from the `rows` of its run's metrics.csv (one per round,
    R ≥ 2 of them: `PEER_ROUNDS`; the run evaluates the dev set once, after round R). Its peak
    memory two ways: "peak_mb", the run's (driver + worker, that evaluation included), and
    "training_peak_mb", the driver's high-water mark at the end of round R − 1 (rounds 1..R−1
    and the preparation of round R's batches, before the evaluation) plus the worker's: the
    peer evaluates nothing.

    >>> rows = [{"round_seconds": s, "data_seconds": "0.5", "peak_rss_mb": d,
    ...          "worker_peak_rss_mb": w, "train_loss": "0.7"}
    ...         for s, d, w in (("9", "1000", "400"), ("3", "1200", "450"), ("5", "1700", "460"))]
    >>> m = tffl_measures(rows, client_steps=4)
    >>> m["seconds_per_client_step"], m["peak_mb"], m["training_peak_mb"]
    (1.0, 2160.0, 1660.0)
    """
    seconds = [float(row["round_seconds"]) for row in rows]
    measures = {"round_seconds": seconds,
                "data_seconds": [float(row["data_seconds"]) for row in rows],
                "seconds_per_client_step": _steady_per_step(seconds, client_steps),
                "last_round_seconds_per_client_step": seconds[-1] / client_steps,
                "driver_peak_mb": max(float(row["peak_rss_mb"]) for row in rows),
                "driver_training_peak_mb": max(float(row["peak_rss_mb"]) for row in rows[:-1]),
                "worker_peak_mb": max(float(row["worker_peak_rss_mb"]) for row in rows),
                "losses": [float(row["train_loss"]) for row in rows]}
    measures["peak_mb"] = measures["driver_peak_mb"] + measures["worker_peak_mb"]
    measures["training_peak_mb"] = (measures["driver_training_peak_mb"]
                                    + measures["worker_peak_mb"])
    return measures


def run_peer(config: TargetsConfig, output_dir: pathlib.Path, log) -> dict:
    """{"<model> N = <N>": {"tffl": {...}, "peft": {...}, "seconds_ratio", "memory_ratio"},
    "versions"} for each model of `config.peer_models` and N of `PEER_CLIENTS`, or
    {"skipped": reason} without a peer Python (module docstring)."""
    unknown = [m for m in config.peer_models if m not in PEER_SETTINGS]
    if unknown:
        raise ValueError(f"peer_models={','.join(config.peer_models)}: unknown "
                         f"{', '.join(unknown)}; choose from {', '.join(PEER_SETTINGS)}")
    problem = peer_python_problem(config.peer_python)
    if problem is not None:
        log(f"peer: skipped: {problem}. Make a Python with the peer's libraries "
            f"({PEER_SETUP}) and pass --peer_python=/tmp/hf/bin/python")
        return {"skipped": problem}
    from runner import run
    from tffl.simulation import driver, metrics_log

    folders = {(model, n): output_dir / f"peer_{model}_{n}"
               for model in config.peer_models for n in PEER_CLIENTS}
    for folder in folders.values():
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds an earlier peer run; give another --output_dir")
    results = {}
    for (model, clients), folder in folders.items():
        setting = PEER_SETTINGS[model]
        run_config = peer_run_config(config, model, clients, folder / "tffl")
        log(f"peer: tffl {PEER_ALGORITHM} on {model}, N = {clients}, {PEER_ROUNDS} rounds -> "
            f"{folder / 'tffl'}")
        run.run(run_config)
        rows = metrics_log.read_metrics(folder / "tffl" / driver.METRICS_FILE)
        work = folder / "peft"
        work.mkdir(parents=True)
        num_clients, steps = export_batches(run_config, work / "batches.npz")
        (work / "setting.json").write_text(json.dumps({
            "family": setting.family, "checkpoint": str(peer_checkpoint(model, output_dir)),
            "rank": setting.rank, "layers": list(setting.layers),
            "learning_rate": setting.learning_rate, "num_classes": 2, "rounds": PEER_ROUNDS,
            "clients": num_clients, "steps": steps, "seed": config.seed,
            "threads": os.cpu_count() or 1}, indent=1))
        log(f"peer: Transformers + PEFT FedAvg on the same batches -> {work}")
        status = subprocess.run([config.peer_python, str(PEFT_LOOP), str(work)],
                                check=False).returncode
        if status != 0:
            raise ValueError(f"the peer's loop ({config.peer_python} {PEFT_LOOP} {work}) "
                             f"failed with status {status}; its output is above")
        peft = json.loads((work / "peft.json").read_text())
        client_steps = num_clients * steps
        tffl = tffl_measures(rows, client_steps)
        peft_seconds = [r["seconds"] for r in peft["rounds"]]
        side = {"round_seconds": peft_seconds,
                "seconds_per_client_step": _steady_per_step(peft_seconds, client_steps),
                "peak_mb": peft["peak_rss_mb"], "libraries_mb": peft["libraries_rss_mb"],
                "losses": [r["loss"] for r in peft["rounds"]]}
        results[f"{model} N = {clients}"] = {
            "client_steps_per_round": client_steps, "tffl": tffl, "peft": side,
            "seconds_ratio": tffl["seconds_per_client_step"] / side["seconds_per_client_step"],
            "memory_ratio": tffl["peak_mb"] / side["peak_mb"],
            "training_memory_ratio": tffl["training_peak_mb"] / side["peak_mb"]}
        results["versions"] = peft["versions"]
        log(f"peer {model} N = {clients}: tffl {tffl['seconds_per_client_step']:.3f} s/client "
            f"step, {tffl['peak_mb']:.0f} MB ({tffl['training_peak_mb']:.0f} MB before its dev "
            f"evaluation); Transformers + PEFT "
            f"{side['seconds_per_client_step']:.3f} s/client step, {side['peak_mb']:.0f} MB")
    return results
