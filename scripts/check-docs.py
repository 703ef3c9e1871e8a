#!/usr/bin/env python3
"""Checks the documentation against the repository.

- Every relative link in README.md and docs/**/*.md names a file that exists, and an `#anchor`
  names a heading of that page (GitHub's slugs).
- docs/results/README.md lists every file in docs/results/, and every file it lists exists.
- Every `docs/results/FILE` a page cites exists.
- The README's first code block gives the two fresh-machine commands: `scripts/demo.sh` and
  `cargo test --workspace`, and .ci/run runs the latter.

With --run-getting-started it also runs the shell blocks of docs/getting-started.md in order,
in one `bash -euo pipefail` from the repository's root (as root, with /dev/kvm), and fails if
any command fails.

Usage: scripts/check-docs.py [--run-getting-started]
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def pages():
    yield os.path.join(ROOT, "README.md")
    for dirpath, _, files in os.walk(os.path.join(ROOT, "docs")):
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(dirpath, f)


def strip_code(text):
    """The page without its fenced code blocks and inline code spans."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", open(path, encoding="utf-8").read())
    seen = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    for m in re.finditer(r'<a (?:name|id)="([^"]+)"', text):
        out.add(m.group(1))
    return out


def check_links(errors):
    for page in pages():
        rel = os.path.relpath(page, ROOT)
        text = strip_code(open(page, encoding="utf-8").read())
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
            if not os.path.exists(dest):
                errors.append(f"{rel}: link to {target}: no such file")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append(f"{rel}: link to {target}: no heading #{anchor} there")


def check_results(errors):
    index = os.path.join(RESULTS, "README.md")
    if not os.path.isfile(index):
        errors.append("docs/results/README.md: missing (the index of docs/results/)")
        return
    listed_text = open(index, encoding="utf-8").read()
    files = sorted(f for f in os.listdir(RESULTS) if f != "README.md")
    for f in files:
        if f not in listed_text:
            errors.append(f"docs/results/{f}: not listed in docs/results/README.md")
    for name in set(re.findall(r"[\w.+-]+\.(?:csv|svg|txt|json|md)\b", listed_text)):
        if name != "README.md" and "/" not in name and name not in files and not re.search(
            r"\w\.md$", name
        ):
            errors.append(f"docs/results/README.md lists {name}, which does not exist")
    for page in pages():
        text = open(page, encoding="utf-8").read()
        for name in re.findall(r"results/([\w.+-]+\.(?:csv|svg|txt|json))", text):
            if name not in files:
                errors.append(f"{os.path.relpath(page, ROOT)} cites docs/results/{name}: missing")


def check_readme(errors):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = FENCE.search(text)
    block = m.group(2) if m else ""
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    for want in ("scripts/demo.sh", "cargo test --workspace"):
        if want not in commands:
            errors.append(f"README.md: the first code block does not give `{want}`")
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    if not re.search(r"^cargo test --workspace\b", ci, re.M):
        errors.append(".ci/run does not run the README's test command (cargo test --workspace)")


def run_getting_started():
    text = open(os.path.join(ROOT, "docs", "getting-started.md"), encoding="utf-8").read()
    blocks = [body for lang, body in FENCE.findall(text) if lang == "sh"]
    script = "\n".join(blocks)
    print(f"check-docs: running getting-started's {len(blocks)} shell blocks", flush=True)
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT)
    finally:
        # What the page creates, should a command fail half-way.
        subprocess.run(["ip", "netns", "del", "demo"], stderr=subprocess.DEVNULL)
    return done.returncode == 0


def main():
    errors = []
    check_links(errors)
    check_results(errors)
    check_readme(errors)
    for e in errors:
        print(f"check-docs: {e}", file=sys.stderr)
    if errors:
        return 1
    print("check-docs: links, results index and README commands agree with the tree")
    if "--run-getting-started" in sys.argv[1:] and not run_getting_started():
        print("check-docs: a command of docs/getting-started.md failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
