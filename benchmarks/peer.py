"""`--suite=targets`'s peer part (benchmarks/targets.py): tffl beside the library its users would
otherwise pick, Hugging Face Transformers + PEFT in a FedAvg loop, on the same batches.

For each N of `PEER_CLIENTS`, one after the other:

1. tffl: `runner.run.run` (what scripts/train.py runs) trains FedAvg-LoRA on SST-2 with the
   pretrained all-MiniLM-L6-v2 at experiment 1's protocol (LoRA r = 4, α = r, on query and value
   of layers 3-5, mean pooling, a linear head; N IID clients, all of them every round,
   `PEER_LOCAL_STEPS` SGD steps of batch `PEER_BATCH_SIZE`; sentences whole, batches bucketed by
   length) for `PEER_ROUNDS` rounds, on its default path (the TFF worker, the frozen layers'
   outputs cached). From its metrics.csv: each round's seconds and the driver's and the
   worker's peak resident memory (`tffl.simulation.memory`).
2. The same run's batches: the task built again without the cached prefix hands out, for each
   round and client, the token batches tffl trained on (the same examples in the same order;
   the cache changes what a batch carries, not which examples). They go to
   `<output_dir>/peer_<N>/peft/batches.npz` with `setting.json`.
3. The peer: `benchmarks/peft_loop.py`, run by `TargetsConfig.peer_python` (a Python with torch,
   transformers and peft; tffl's environment has none of them), trains the same model from the
   same checkpoint on those batches (module docstring there) and writes `peft.json`.

Reported per N: each side's seconds per client step (the mean of rounds 2.. over the client
steps of a round; round 1 holds tffl's compilation), its peak memory (tffl: driver + worker),
and `seconds_ratio` and `memory_ratio`, tffl's over the peer's. Without a peer Python the part
says how to make one and reports `{"skipped": reason}`.

>>> PEER_SETUP.split(" && ")[0]
'python3 -m venv /tmp/hf'
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np

from benchmarks.config import TargetsConfig

PEER_CLIENTS = (3, 20)
PEER_ROUNDS = 5
PEER_LOCAL_STEPS = 10
PEER_BATCH_SIZE = 16
PEER_RANK = 4
PEER_LAYERS = (3, 4, 5)
PEER_ALGORITHM = "fedavg_lora"
PEER_SETUP = "python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers peft safetensors"
PEFT_LOOP = pathlib.Path(__file__).with_name("peft_loop.py")


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


def peer_run_config(config: TargetsConfig, clients: int, folder: pathlib.Path):
    """The tffl run of N = `clients` (module docstring), a `runner.run_config.RunConfig`."""
    from runner.run_config import RunConfig

    return RunConfig().with_changes(
        task="sst2", backbone="minilm", data_dir=config.data_dir, algorithm=(PEER_ALGORITHM,),
        rank=PEER_RANK, lora_targets=("query", "value"), lora_layers=PEER_LAYERS,
        partition="iid", num_clients=clients, clients_per_round=clients, rounds=PEER_ROUNDS,
        local_steps=PEER_LOCAL_STEPS, batch_size=PEER_BATCH_SIZE,
        learning_rate=config.learning_rate, eval_every=PEER_ROUNDS, seed=config.seed,
        output_dir=str(folder))


def export_batches(run_config, path: pathlib.Path) -> tuple[int, int]:
    """Writes the token batches of `run_config`'s rounds to `path` (npz, keys
    `r<round>_c<client index>_s<step>_<token_ids|padding_mask|segment_ids|labels>`); returns
    (clients, steps per client)."""
    from runner import training

    task = training.run_task_for(PEER_ALGORITHM, run_config.with_changes(prefix_cache=False))
    arrays, steps = {}, set()
    for round_num in range(1, PEER_ROUNDS + 1):
        for index, cid in enumerate(task.client_ids):
            batches = list(task.client_dataset_fn(cid, round_num).as_numpy_iterator())
            steps.add(len(batches))
            for step, (features, labels) in enumerate(batches):
                prefix = f"r{round_num}_c{index}_s{step}_"
                for key in ("token_ids", "padding_mask", "segment_ids"):
                    arrays[prefix + key] = np.asarray(features[key])
                arrays[prefix + "labels"] = np.asarray(labels)
    np.savez(path, **arrays)
    (count,) = steps
    return len(task.client_ids), count


def _steady_per_step(round_seconds: list[float], client_steps: int) -> float:
    steady = round_seconds[1:]
    return sum(steady) / len(steady) / client_steps


def run_peer(config: TargetsConfig, output_dir: pathlib.Path, log) -> dict:
    """{"<N>": {"tffl": {...}, "peft": {...}, "seconds_ratio", "memory_ratio"}, "versions"} for
    each N of `PEER_CLIENTS`, or {"skipped": reason} without a peer Python (module docstring)."""
    problem = peer_python_problem(config.peer_python)
    if problem is not None:
        log(f"peer: skipped: {problem}. Make a Python with the peer's libraries "
            f"({PEER_SETUP}) and pass --peer_python=/tmp/hf/bin/python")
        return {"skipped": problem}
    from models import checkpoints
    from runner import run
    from tffl.simulation import driver, metrics_log

    folders = {n: output_dir / f"peer_{n}" for n in PEER_CLIENTS}
    for folder in folders.values():
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} holds an earlier peer run; give another --output_dir")
    checkpoint = checkpoints.fetch_minilm()
    results = {}
    for clients, folder in folders.items():
        run_config = peer_run_config(config, clients, folder / "tffl")
        log(f"peer: tffl {PEER_ALGORITHM} on MiniLM, N = {clients}, {PEER_ROUNDS} rounds -> "
            f"{folder / 'tffl'}")
        run.run(run_config)
        rows = metrics_log.read_metrics(folder / "tffl" / driver.METRICS_FILE)
        work = folder / "peft"
        work.mkdir(parents=True)
        num_clients, steps = export_batches(run_config, work / "batches.npz")
        (work / "setting.json").write_text(json.dumps({
            "checkpoint": str(checkpoint), "rank": PEER_RANK, "targets": ["query", "value"],
            "layers": list(PEER_LAYERS), "learning_rate": config.learning_rate,
            "num_classes": 2, "rounds": PEER_ROUNDS, "clients": num_clients, "steps": steps,
            "seed": config.seed, "threads": os.cpu_count() or 1}, indent=1))
        log(f"peer: Transformers + PEFT FedAvg on the same batches -> {work}")
        subprocess.run([config.peer_python, str(PEFT_LOOP), str(work)], check=True)
        peft = json.loads((work / "peft.json").read_text())
        client_steps = num_clients * steps
        tffl_seconds = [float(row["round_seconds"]) for row in rows]
        tffl = {"round_seconds": tffl_seconds,
                "seconds_per_client_step": _steady_per_step(tffl_seconds, client_steps),
                "driver_peak_mb": max(float(row["peak_rss_mb"]) for row in rows),
                "worker_peak_mb": max(float(row["worker_peak_rss_mb"]) for row in rows),
                "losses": [float(row["train_loss"]) for row in rows if "train_loss" in row]}
        tffl["peak_mb"] = tffl["driver_peak_mb"] + tffl["worker_peak_mb"]
        peft_seconds = [r["seconds"] for r in peft["rounds"]]
        side = {"round_seconds": peft_seconds,
                "seconds_per_client_step": _steady_per_step(peft_seconds, client_steps),
                "peak_mb": peft["peak_rss_mb"], "libraries_mb": peft["libraries_rss_mb"],
                "losses": [r["loss"] for r in peft["rounds"]]}
        results[str(clients)] = {
            "client_steps_per_round": client_steps, "tffl": tffl, "peft": side,
            "seconds_ratio": tffl["seconds_per_client_step"] / side["seconds_per_client_step"],
            "memory_ratio": tffl["peak_mb"] / side["peak_mb"]}
        results["versions"] = peft["versions"]
        log(f"peer N = {clients}: tffl {tffl['seconds_per_client_step']:.3f} s/client step, "
            f"{tffl['peak_mb']:.0f} MB; Transformers + PEFT "
            f"{side['seconds_per_client_step']:.3f} s/client step, {side['peak_mb']:.0f} MB")
    return results
