"""The allocations live at a memray capture's high-water mark, summed by the first five lines of
the checkout's own code on their stack (else the top frame):

    python memray_high_water.py driver.bin /path/to/checkout/
"""
import sys, collections
from memray import FileReader
r = FileReader(sys.argv[1]); root = sys.argv[2]
recs = list(r.get_high_watermark_allocation_records(merge_threads=True))
print("total at peak GB", sum(x.size for x in recs)/1e9)
agg = collections.Counter()
for x in recs:
    st = x.stack_trace(max_stacks=80)
    ours = [f"{f[0]}:{f[1].split(root)[-1]}:{f[2]}" for f in st if root in f[1] and '.venv' not in f[1]]
    key = " <- ".join(ours[:5]) if ours else ("TOP:" + (f"{st[0][0]}:{st[0][1].split('/')[-1]}" if st else "?"))
    agg[key] += x.size
for k, v in agg.most_common(12):
    print(f"{v/1e6:9.1f} MB  {k}")
