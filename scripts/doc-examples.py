#!/usr/bin/env python3
"""Checks and runs the examples of README.md and docs/*.md, so that none of them rots.

- Every fenced block names its language (rustdoc would take a bare block for Rust).
- Every page with a `rust` block is a doctest of silvic-net (`include_str!` in
  crates/silvic-net/src/lib.rs), so `cargo test --workspace --doc` compiles and runs it.
- Every `python` block compiles.
- With --run, every block whose info string is `python run` runs with --python (a venv with the
  wheel, Ray and numpy), and every `sh run` block runs under bash from the repository root,
  each bounded in time. Other blocks are fragments: commands for a cluster, a train loop.

    python3 scripts/doc-examples.py                              # the checks that need nothing
    python3 scripts/doc-examples.py --run --python .venv/bin/python

Prints each problem and exits 1 if there is one.
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)(```|~~~)\s*(.*?)\s*$")
LIB = ROOT / "crates/silvic-net/src/lib.rs"
TIMEOUT = 600


def pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path):
    """(line number, info string, code) of every fenced block of a markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start, fence, info = i + 1, opening.group(2), opening.group(3)
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield start, info, "\n".join(body) + "\n"


def check(problems):
    lib = LIB.read_text(encoding="utf-8")
    for page in pages():
        name = page.relative_to(ROOT)
        has_rust = False
        for line, info, code in blocks(page):
            language = re.split(r"[\s,]", info)[0] if info else ""
            if not language:
                problems.append(f"{name}:{line}: a fenced block without a language")
            if language == "rust":
                has_rust = True
            if language == "python":
                try:
                    compile(code, f"{name}:{line}", "exec")
                except SyntaxError as error:
                    problems.append(f"{name}:{line}: python does not compile: {error}")
        include = f'include_str!("../../../{name}")'
        if has_rust and include not in lib:
            problems.append(f"{name}: has Rust examples but is no doctest ({include} in {LIB.name})")


def run(problems, python):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    for page in pages():
        name = page.relative_to(ROOT)
        for line, info, code in blocks(page):
            words = info.split()
            if len(words) < 2 or words[1] != "run":
                continue
            if words[0] == "python":
                with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
                    script.write(code)
                command = [python, script.name]
            elif words[0] == "sh":
                command = ["bash", "-euo", "pipefail", "-c", code]
            else:
                problems.append(f"{name}:{line}: cannot run a `{words[0]}` block")
                continue
            print(f"=== {name}:{line} ({words[0]})", flush=True)
            try:
                done = subprocess.run(command, cwd=ROOT, env=env, timeout=TIMEOUT)
                if done.returncode != 0:
                    problems.append(f"{name}:{line}: exited {done.returncode}")
            except subprocess.TimeoutExpired:
                problems.append(f"{name}:{line}: still running after {TIMEOUT} s")
            finally:
                if words[0] == "python":
                    os.unlink(script.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run the `python run` and `sh run` blocks")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for Python blocks")
    args = parser.parse_args()
    problems = []
    check(problems)
    if args.run:
        run(problems, args.python)
    for problem in problems:
        print(problem)
    print(f"{len(pages())} pages checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
