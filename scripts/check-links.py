#!/usr/bin/env python3
"""Checks that every relative link in README.md, CHANGELOG.md and docs/ (its folders too) resolves.

A link's file must exist in the repository, and its #anchor, if any, must be a heading of that
file (as GitHub makes anchors: lower-case, punctuation dropped, spaces as hyphens). Links to
http(s) and mailto are not followed. Prints each broken link and exits 1 if there is one.

    python3 scripts/check-links.py
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(path):
    """The lines of a markdown file outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def anchors(path):
    """The anchors GitHub gives the headings of a markdown file."""
    seen, out = {}, set()
    for _, line in prose(path):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def main():
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for source in files:
        if not source.exists():
            continue
        for number, line in prose(source):
            for target in LINK.findall(line):
                if re.match(r"^(https?|mailto):", target):
                    continue
                file_part, _, anchor = target.partition("#")
                resolved = (source.parent / file_part).resolve() if file_part else source
                where = f"{source.relative_to(ROOT)}:{number}: {target}"
                if ROOT not in resolved.parents and resolved != ROOT:
                    broken.append(f"{where}: outside the repository")
                elif not resolved.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    broken.append(f"{where}: no heading #{anchor}")
    for line in broken:
        print(line)
    print(f"{len(files)} files checked, {len(broken)} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
