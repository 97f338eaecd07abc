#!/usr/bin/env python3
"""The crate's layers, checked: each folder imports only the folders below it, and no
two modules (a file with the files under its folder) import each other in a loop.

    api -> shell -> state -> wire -> policy and the ground files (config, error, ...)

Exit 1, naming the imports, when either rule is broken."""
import glob
import re
import sys

FOLDERS = ["api", "shell", "state", "wire", "policy"]
RANK = {f: len(FOLDERS) - i for i, f in enumerate(FOLDERS)}  # ground files rank 0


def module_of(path):
    parts = path[len("src/"):-len(".rs")].split("/")
    if parts[0] in FOLDERS and len(parts) > 1:
        return "::".join(parts[:2])
    return parts[0]


def rank(module):
    return RANK.get(module.split("::")[0], 0)


def main():
    deps, bad = {}, []
    for path in sorted(glob.glob("src/**/*.rs", recursive=True)):
        if path.startswith("src/bin") or path == "src/lib.rs":
            continue
        me = module_of(path)
        text = open(path).read()
        for m in re.finditer(r"crate::(\w+)(?:::(\w+))?", text):
            top, sub = m.group(1), m.group(2)
            dep = f"{top}::{sub}" if top in FOLDERS and sub else top
            if dep == me or dep in ("docs", "protocol", "redis"):
                continue
            deps.setdefault(me, set()).add(dep)
            if rank(dep) > rank(me):
                bad.append(f"{path}: imports {dep} from a lower layer")
    cycles = strongly_connected(deps)
    for c in cycles:
        bad.append("modules in a loop: " + ", ".join(sorted(c)))
    for line in sorted(set(bad)):
        print(line)
    print(f"modules {len(deps)}, layer breaks and loops {len(set(bad))}")
    return 1 if bad else 0


def strongly_connected(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main())
