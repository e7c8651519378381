"""benchmarks/timeline.py and scripts/memory_timeline.py: a command's memory and CPU seconds cut
at its progress lines, against a child whose allocations and sleeps are known."""

import pathlib
import sys

from benchmarks import timeline

CHILD = """
import time
print("tffl: allocating ...", flush=True)
block = bytearray(300 * 10**6)          # 300 MB, touched so that it is resident
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(1.5)
print("round 1/2  loss 0.5", flush=True)
del block
time.sleep(1.0)
print("done: 2 rounds", flush=True)
"""


def test_stages_follow_the_progress_lines_and_see_the_allocation():
    lines = []
    status, samples, marks = timeline.run_timeline([sys.executable, "-c", CHILD], 0.1,
                                                    echo=lines.append)
    assert status == 0
    assert [label for _, label in marks] == ["start", "allocating ...", "round 1/2",
                                              "done: 2 rounds"]
    rows = {r["stage"]: r for r in timeline.stages(samples, marks)}
    allocating, after = rows["allocating ..."], rows["round 1/2"]
    assert allocating["driver_mb_max"] - rows["start"]["driver_mb_end"] > 250
    assert allocating["seconds"] >= 1.5 and after["seconds"] >= 1.0
    assert after["driver_mb_end"] < allocating["driver_mb_max"] - 250   # freed
    assert allocating["worker_mb_max"] == 0 and allocating["worker_cpu_s"] == 0  # no TFF worker
    assert any("round 1/2" in line for line in lines)
    table = timeline.format_stages(timeline.stages(samples, marks))
    assert table.splitlines()[0].startswith("| stage | s |") and "allocating ..." in table


def test_stages_of_hand_set_samples():
    S = timeline.Sample
    samples = [S(0.0, 100, 0, 1.0, 0.0), S(1.0, 400, 50, 2.0, 0.5), S(2.0, 300, 80, 2.5, 3.5),
               S(3.0, 300, 60, 2.6, 6.5)]
    rows = timeline.stages(samples, [(0.0, "start"), (1.5, "round 1/1")])
    rows[1]["driver_cpu_s"] = round(rows[1]["driver_cpu_s"], 9)   # 2.6 − 2.0 in floats
    assert timeline.stages(samples[:2] + [S(2.0, 300, 0, 2.5, 0.0)],
                           [(0.0, "start"), (1.5, "done")])[1]["worker_cpu_s"] is None
    assert rows == [
        {"stage": "start", "seconds": 1.5, "driver_cpu_s": 1.0, "worker_cpu_s": 0.5,
         "driver_mb_end": 400, "worker_mb_end": 50, "driver_mb_max": 400, "worker_mb_max": 50},
        {"stage": "round 1/1", "seconds": 1.5, "driver_cpu_s": 0.6, "worker_cpu_s": 6.0,
         "driver_mb_end": 300, "worker_mb_end": 60, "driver_mb_max": 300, "worker_mb_max": 80}]


def test_a_command_that_cannot_start_is_one_line(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "scripts/memory_timeline.py",
                           f"--output_dir={tmp_path}", "--", "no_such_program_here"],
                          capture_output=True, text=True, timeout=120,
                          cwd=pathlib.Path(__file__).resolve().parents[2])
    assert proc.returncode != 0
    assert "cannot start 'no_such_program_here'" in proc.stderr
    assert "Traceback" not in proc.stderr
