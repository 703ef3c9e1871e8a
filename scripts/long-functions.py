#!/usr/bin/env python3
"""Lists the non-test functions over 80 lines in the workspace's crates.

A function counts from its `fn` line to its closing brace; test code (a file under `tests`, or
anything after a file's first `#[cfg(test)]`) is left out. A function may be longer if the
line right above it (or above its attributes and doc comment) says why: `// long: REASON`.
Exit status 1 if any function is over without one.

Usage: scripts/long-functions.py [--limit N] [DIR ...]   (default: every crate's source)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["src", "devices/src", "cotune/src", "guest/driver/src", "guest/baremetal/src",
           "integration_tests/src"]
FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(async\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def reason_above(lines, i):
    j = i - 1
    while j >= 0 and (lines[j].strip().startswith("///") or lines[j].strip().startswith("#[")):
        j -= 1
    return j >= 0 and lines[j].strip().startswith("// long:")


def long_functions(path, limit):
    lines = open(path, encoding="utf-8").read().split("\n")
    cut = next((i for i, l in enumerate(lines) if l.strip() == "#[cfg(test)]"), len(lines))
    out = []
    i = 0
    while i < cut:
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i
        while j < cut and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";"):
            j += 1
        if j >= cut or lines[j].rstrip().endswith(";"):
            i = j + 1
            continue
        k = j + 1
        while k < cut and not (lines[k].startswith(" " * indent + "}")
                               and len(lines[k]) - len(lines[k].lstrip()) == indent):
            k += 1
        n = k - i + 1
        if n > limit and not reason_above(lines, i):
            out.append((n, i + 1, m.group(8)))
        i = k + 1
    return out


def main():
    args = sys.argv[1:]
    limit = 80
    if args[:1] == ["--limit"]:
        limit, args = int(args[1]), args[2:]
    found = []
    for d in args or DEFAULT:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                if not f.endswith(".rs") or "/tests/" in "/" + rel or f == "tests.rs":
                    continue
                for n, line, name in long_functions(path, limit):
                    found.append((n, f"{rel}:{line}", name))
    for n, where, name in sorted(found, reverse=True):
        print(f"{n:4} lines  {where}  {name}")
    if found:
        print(f"{len(found)} function(s) over {limit} lines without a `// long:` reason")
        return 1
    print(f"no function over {limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
