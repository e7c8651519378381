"""What the tffl.runtime tests and tests/scripts/test_start_worker.py share: a federated mean to
run on workers, and a wait for a process to be gone."""

import time

import numpy as np
import psutil
import tensorflow_federated as tff


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def federated_mean(values):
    return tff.federated_mean(values)


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
