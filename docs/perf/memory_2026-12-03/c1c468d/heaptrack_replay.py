"""Replay a heaptrack v3 data file: find the heap peak, list live allocations there by (size, trace)."""
import sys, subprocess, collections
path = sys.argv[1]; minsize = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
def lines():
    p = subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE, text=True, errors="replace", bufsize=1 << 20)
    for line in p.stdout:
        yield line
sizes, traces = [], []
total = peak = 0; peak_event = -1; ev = 0
for line in lines():
    c = line[0]
    if c == '+':
        k = int(line[2:], 16); total += sizes[k]; ev += 1
        if total > peak: peak, peak_event = total, ev
    elif c == '-':
        k = int(line[2:], 16); total -= sizes[k]; ev += 1
    elif c == 'a':
        _, s, t = line.split(); sizes.append(int(s, 16)); traces.append(int(t, 16))
print("peak", peak / 1e6, "MB at event", peak_event, file=sys.stderr)
# pass 2
strings, ips, tparent = [""], [None], [None]
live = collections.Counter(); total = 0; ev = 0; sizes = []; traces = []
tm = 0; peak_time = None
for line in lines():
    c = line[0]
    if c == 's': strings.append(line[2:].rstrip("\n").split(" ", 1)[1] if " " in line[2:] else "")
    elif c == 'i':
        f = line.split(); ips.append(int(f[3], 16) if len(f) > 3 else 0)
    elif c == 't':
        _, ip, parent = line.split(); tparent.append((int(ip, 16), int(parent, 16)))
    elif c == 'a':
        _, s, t = line.split(); sizes.append(int(s, 16)); traces.append(int(t, 16))
    elif c == 'c': tm = int(line[2:], 16)
    elif c in '+-':
        if ev >= peak_event: continue
        k = int(line[2:], 16); ev += 1
        if c == '+': live[k] += 1; total += sizes[k]
        else: live[k] -= 1; total -= sizes[k]
        if ev == peak_event: peak_time = tm
print("replayed total", total / 1e6, "MB; peak at", peak_time, "ms", file=sys.stderr)
def chain(t):
    out = []
    while t and len(out) < 40:
        ip, parent = tparent[t]
        out.append(strings[ips[ip]] if ips[ip] < len(strings) else "?")
        t = parent
    return out
import re
KEY = re.compile(r'(Op|Kernel|Base)\w*(<.*>)?::Compute|RestoreOp::run|CopyVariable|EnsureSparse|Assign|Arena|Graph|Session|protobuf')
groups = collections.Counter(); counts = collections.Counter()
small = 0
for k, n in live.items():
    if n <= 0: continue
    b = sizes[k] * n
    if sizes[k] < minsize: small += b; continue
    ch = chain(traces[k])
    op = next((f for f in ch if KEY.search(f)), ch[0] if ch else "?")
    key = (op[:90], sizes[k])
    groups[key] += b; counts[key] += n
print(f"allocations below {minsize} B each: {small/1e6:.1f} MB")
for (op, size), b in groups.most_common(60):
    print(f"{b/1e6:9.1f} MB  {counts[(op,size)]:4d} x {size/1e6:9.3f} MB  {op}")
