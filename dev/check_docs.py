#!/usr/bin/env python3
"""
The repo's reading rules, checked (`make docs-check`, part of `make test`):
- every relative link in a tracked .md file points to a tracked file, and its #anchor to a heading there;
- no tracked file refers to notes outside the repo or to issue numbers (the repo speaks for itself);
- README.md is a front door of at most 400 lines, dev/cuda/README.md at most 100;
- no line of the root C/CUDA files is longer than 120 columns;
- every parallel loop of the twin (train_fox.c) asks parallel_pays whether its work pays for the threads.
Prints each problem as file:line: what, and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

MAX_LINES = {"README.md": 400, "dev/cuda/README.md": 100}
ROOT_CODE = ["train_fox.cu", "dev/generate.cuh", "train_fox.c", "test_fox.cu"]
# the names are split so that this file does not name them itself
OUTSIDE = re.compile("|".join([r"FOX" r"_SPEC", r"BENCH" r"MARKS\.md", r"HF" r"_LAYOUT", r"\.\./sha" r"red",
                               r"(^|[^a-z])iss" r"ues? #?[0-9]+"]), re.I)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        in_code = False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                in_code = not in_code
            m = re.match(r"#{1,6} (.*)", line) if not in_code else None
            if m:
                a = anchor(m.group(1))
                n = seen.get(a, 0)
                seen[a] = n + 1
                out.add(a if n == 0 else f"{a}-{n}")
        cache[path] = out
    return cache[path]


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
    if not root:
        sys.exit("error: not inside the train_fox git repository\nHINT: run it from the checkout")
    os.chdir(root)
    tracked = set(subprocess.run(["git", "ls-files"], capture_output=True, text=True).stdout.split())
    problems = []
    for path in sorted(tracked):
        if not os.path.isfile(path) or path.startswith("dev/fixtures/") or path.endswith((".png", ".bin", ".fxds")):
            continue
        try:
            lines = open(path, encoding="utf-8").read().split("\n")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            if OUTSIDE.search(line):
                problems.append(f"{path}:{n}: refers to notes outside the repo or to an issue number")
            if path in ROOT_CODE and len(line) > 120:
                problems.append(f"{path}:{n}: {len(line)} columns (at most 120)")
            if path == "train_fox.c" and "#pragma omp parallel" in line and "if(parallel_pays(" not in line:
                problems.append(f"{path}:{n}: a parallel loop without if(parallel_pays(work))")
        if path in MAX_LINES and len(lines) - 1 > MAX_LINES[path]:
            problems.append(f"{path}: {len(lines) - 1} lines (at most {MAX_LINES[path]})")
        if path.endswith(".md"):
            in_code = False
            for n, line in enumerate(lines, 1):
                if line.startswith("```"):
                    in_code = not in_code
                if in_code:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"[a-z]+://|mailto:", target):
                        continue
                    file_part, _, frag = target.partition("#")
                    dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                    if dest not in tracked and not any(t.startswith(dest + "/") for t in tracked):
                        problems.append(f"{path}:{n}: link to {target}: {dest} is not a tracked file")
                    elif frag and dest.endswith(".md") and frag not in anchors_of(dest):
                        problems.append(f"{path}:{n}: link to {target}: no heading #{frag} in {dest}")
    for p in problems:
        print(p)
    print(f"docs-check: {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
