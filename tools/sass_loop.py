"""Instruction mix of the hottest (largest backward-branch) loop in a cuobjdump SASS listing.

    python tools/sass_loop.py kernel.sass
"""
import collections
import re
import sys


def main(path):
    ins = []
    for line in open(path):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    addr = {a: i for i, (a, _, _) in enumerate(ins)}
    loops = []
    for i, (a, op, rest) in enumerate(ins):
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", rest)
            if t and int(t.group(1), 16) < a and int(t.group(1), 16) in addr:
                loops.append((addr[int(t.group(1), 16)], i))
    if not loops:
        print("no loop")
        return
    s, e = max(loops, key=lambda l: l[1] - l[0])
    body = ins[s:e + 1]
    c = collections.Counter(op.split(".")[0] for _, op, _ in body)
    print(f"loop {len(body)} instructions ({ins[s][0]:#x}..{ins[e][0]:#x}) of {len(ins)}")
    print(" ".join(f"{k}:{v}" for k, v in c.most_common()))


if __name__ == "__main__":
    main(sys.argv[1])
