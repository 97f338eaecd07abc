#!/usr/bin/env python3
"""The MSRV check that needs no second toolchain: every crate the library builds on
(normal dependencies, all features) must declare a `rust-version` no newer than ours.
Together with clippy's `incompatible_msrv` lint (on under `-D warnings`), which flags
standard-library items newer than our `rust-version`, this keeps `rust-version` true.
Prints the newest requirement in the graph; exits 1 if one exceeds ours."""
import json
import subprocess
import sys


def version(v):
    return tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])


meta = json.loads(
    subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
        stderr=subprocess.DEVNULL,
    )
)
by_id = {p["id"]: p for p in meta["packages"]}
root = meta["resolve"]["root"]
ours = by_id[root]["rust_version"]
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

# Walk normal (non-dev, non-build) edges from the root.
seen, stack = set(), [root]
while stack:
    pid = stack.pop()
    if pid in seen:
        continue
    seen.add(pid)
    for dep in nodes[pid]["deps"]:
        if any(k["kind"] is None for k in dep["dep_kinds"]):
            stack.append(dep["pkg"])

too_new = []
newest = ("0.0.0", None)
for pid in seen - {root}:
    p = by_id[pid]
    rv = p.get("rust_version")
    if not rv:
        continue
    if version(rv) > version(newest[0]):
        newest = (rv, p["name"])
    if version(rv) > version(ours):
        too_new.append(f"{p['name']} {p['version']} needs Rust {rv}")

print(f"rust-version {ours}; {len(seen) - 1} crates in the library's build graph; "
      f"the newest requirement is {newest[0]} ({newest[1]})")
if too_new:
    print("newer than our rust-version:\n  " + "\n  ".join(sorted(too_new)))
    sys.exit(1)
