#!/usr/bin/env python3
"""The crate's layers, checked: each folder imports only the folders below it, and no
two modules (a file with the files under its folder) import each other in a loop.
Imports are read from `crate::` paths, brace groups (`crate::{api::guard, ...}`) and
the root re-exports of `src/lib.rs` (`crate::LockGuard` is `api::guard`); comments are
skipped, so doc links are none.

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


def without_comments(text):
    # Doc links (`[Client](crate::Client)`) are no imports; a string holding `crate::`
    # after `//` on a line of code would be skipped too, and there is none.
    return re.sub(r"//[^\n]*", "", text)


def key_of(segments):
    top = segments[0]
    return f"{top}::{segments[1]}" if top in FOLDERS and len(segments) > 1 else top


def split_top(group):
    """`a::b, c::{d, e}` -> [`a::b`, `c::{d, e}`]: commas outside braces."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(group):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(group[start:i])
            start = i + 1
    items.append(group[start:])
    return [i.strip() for i in items if i.strip()]


def expand(prefix, group):
    """`wire::{raw, slot}` under `prefix` -> [`prefix::wire::raw`, `prefix::wire::slot`]."""
    out = []
    for item in split_top(group):
        if "::{" in item:
            head, inner = item.split("::{", 1)
            out += expand(f"{prefix}{head}::", inner[:-1])
        else:
            out.append(prefix + item)
    return out


def reexports():
    """What `src/lib.rs` re-exports at the crate root, by the module it comes from:
    `crate::LockGuard` in a file imports `api::guard` as surely as its full path does."""
    out = {}
    text = without_comments(open("src/lib.rs").read())
    for m in re.finditer(r"^pub use ([^;]+);", text, re.M):
        body = re.sub(r"\s+as\s+", " as ", m.group(1).strip())
        body = re.sub(r"\s+(?!as )(?<! as)", "", body)
        if "::{" in body:
            prefix, group = body.split("::{", 1)
            names = split_top(group.rstrip("}"))
        else:
            prefix, names = body.split(" as ")[0], [body]
        for name in names:
            name = name.split(" as ")[-1].split("::")[-1]
            out[name] = key_of(prefix.split("::"))
    return out


def imports(text, roots):
    """The modules `text` names through `crate::`, brace groups
    (`crate::{api::guard, wire::raw}`) and root re-exports (`crate::Lock`) resolved."""
    text = without_comments(text)
    found = []
    for m in re.finditer(r"crate::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, end = 0, 0
            for end, ch in enumerate(rest):
                depth += ch == "{"
                depth -= ch == "}"
                if depth == 0:
                    break
            paths = expand("", re.sub(r"\s+as\s+\w+|\s+", "", rest[1:end]))
        else:
            paths = [re.match(r"\w+(?:::\w+)?", rest).group(0)] if re.match(r"\w", rest) else []
        for path in paths:
            segments = [s for s in re.split(r"::", path) if s and s[0] not in "{*"]
            if not segments:
                continue
            if segments[0] in roots:
                found.append(roots[segments[0]])
            else:
                found.append(key_of(segments))
    return found


def self_check(roots):
    """The three ways a file can name a module: a path, a brace group, a root
    re-export; a doc link is none. Each once slipped past a regex on `crate::x::y`."""
    text = (
        "use crate::{api::guard::LockGuard as G, wire::{raw, slot::{a, b}}};\n"
        "use crate::Lock;\n/// [`Client`](crate::Client)\nlet h = crate::shell::held::Held;\n"
    )
    got = sorted(set(imports(text, roots)))
    want = ["api::guard", "api::lock", "shell::held", "wire::raw", "wire::slot"]
    assert got == want, f"layers.py reads imports wrong: {got} != {want}"


def main():
    deps, bad = {}, []
    roots = reexports()
    self_check(roots)
    for path in sorted(glob.glob("src/**/*.rs", recursive=True)):
        if path.startswith("src/bin") or path == "src/lib.rs":
            continue
        me = module_of(path)
        for dep in imports(open(path).read(), roots):
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
