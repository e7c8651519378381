"""Live allocations at a memray capture's high-water mark, grouped by the innermost frame of this
repository (run from the checkout: python mr_hwm.py driver.bin)."""
import collections, os, sys
from memray import FileReader
ROOT = os.getcwd() + "/"  # run from the checkout
PKGS = ("tffl/", "models/", "tasks/", "runner/", "scripts/", "benchmarks/")
r = FileReader(sys.argv[1])
by = collections.Counter(); deep = collections.Counter()
for rec in r.get_high_watermark_allocation_records(merge_threads=True):
    stack = rec.stack_trace()
    mine = [f"{fn.split(ROOT)[-1]}:{line} {func}" for func, fn, line in stack
            if any(p in fn for p in PKGS) and "site-packages" not in fn]
    key = mine[0] if mine else (f"[{stack[0][1].split('site-packages/')[-1]}:{stack[0][2]} {stack[0][0]}]" if stack else "<none>")
    by[key] += rec.size
    top = stack[0] if stack else ("?", "?", 0)
    deep[(key, f"{top[1].split('site-packages/')[-1]}:{top[2]} {top[0]}")] += rec.size
print("total MB", sum(by.values()) / 2**20)
for k, v in by.most_common(25):
    print(f"{v/2**20:8.1f} MB  {k}")
print("---")
for k, v in deep.most_common(25):
    print(f"{v/2**20:8.1f} MB  {k[0]}  <- {k[1]}")
