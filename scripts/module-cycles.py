#!/usr/bin/env python3
"""Lists import cycles between the modules of each crate of the workspace.

A module is a source file (`foo.rs` or `foo/mod.rs`); an edge A -> B is a `use` path, or a
path in code, that names B (`crate::x::y`, `super::y`, `self::y`) from A's non-test code
(everything before the first `#[cfg(test)]`). A child naming its parent (`use super::*` of a
file split into submodules) is not an edge back: a parent and the children it declares are one
unit. It also checks the layers of `devices` (LAYERS below: a lower layer never names a higher
one). Exit status 1 if any crate has a cycle or a layer is crossed upwards.

Usage: scripts/module-cycles.py [CRATE_SRC_DIR ...]   (default: every crate's src/)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["src", "devices/src", "cotune/src", "guest/driver/src", "guest/baremetal/src",
           "integration_tests/src"]
# (crate source dir, lower layer, higher layer it must not name): PCI knows nothing of virtio, the
# memory and ring layers nothing of the net device, the backends nothing of virtio.
LAYERS = [
    ("devices/src", "pci", "virtio"),
    ("devices/src", "iovec", "virtio"),
    ("devices/src", "backend", "virtio"),
    ("devices/src", "virtio::vring", "virtio::net"),
    ("devices/src", "virtio::chain", "virtio::net"),
    ("devices/src", "virtio::ring", "virtio::net"),
    ("devices/src", "virtio::packed", "virtio::net"),
    ("devices/src", "virtio::guest", "virtio::net"),
    ("devices/src", "virtio::irq", "virtio::net"),
    ("devices/src", "virtio::vhost_user", "virtio::net"),
    ("devices/src", "counters", "virtio"),
]
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")


def modules(src):
    """Maps a module path ('a::b') to its file."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                rel = []
            if rel and rel[0] == "bin" or "tests" in rel:
                continue  # binaries, and test-only modules (`tests.rs`, `tests/`)
            out["::".join(rel)] = os.path.join(dirpath, f)
    return out


def code(path):
    text = open(path, encoding="utf-8").read()
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    # Comments and strings do not import.
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def resolve(mods, here, kind, rest):
    """The longest module named by a path from module `here`."""
    parts = [p for p in rest.split("::") if p]
    if kind == "crate":
        base = []
    elif kind == "self":
        base = here.split("::") if here else []
    else:
        base = here.split("::")[:-1] if here else []
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    best = None
    for i in range(len(parts) + 1):
        name = "::".join(base + parts[:i])
        if name in mods:
            best = name
    return best


def is_ancestor(a, b):
    return a == "" or b.startswith(a + "::")


def cycles(src):
    mods = modules(src)
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for kind, rest in PATH.findall(code(path)):
            target = resolve(mods, m, kind, rest if rest != "::{" else "")
            if target is None or target == m:
                continue
            if is_ancestor(target, m) or is_ancestor(m, target):
                continue  # parent and children are one unit
            edges[m].add(target)
    # Tarjan's strongly connected components.
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in mods:
        if v not in index:
            visit(v)
    return out, edges


def main():
    dirs = sys.argv[1:] or DEFAULT
    bad = 0
    for d in dirs:
        src = os.path.join(ROOT, d)
        comps, edges = cycles(src)
        for comp in comps:
            bad += 1
            print(f"{d}: cycle between {', '.join(comp)}")
            for a in comp:
                for b in sorted(edges[a] & set(comp)):
                    print(f"    {a} -> {b}")
        for crate, low, high in LAYERS:
            if crate != d:
                continue
            for a in sorted(edges):
                if a == low or a.startswith(low + "::"):
                    for b in sorted(edges[a]):
                        if b == high or b.startswith(high + "::"):
                            bad += 1
                            print(f"{d}: {a} (layer {low}) names {b} (layer {high})")
    if bad:
        return 1
    print(f"no import cycle in {', '.join(dirs)}, no layer crossed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
