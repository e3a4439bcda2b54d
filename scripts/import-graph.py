#!/usr/bin/env python3
"""Checks that the top-level modules of a crate refer to each other in no circle.

A node is a top-level module of the crate: a file or a folder right under src/ (`tcp.rs`,
`ring/`). The root (lib.rs, or main.rs for a binary) is no node: it declares and re-exports
everything. There is an edge A -> B for every place where code of A names B:

- a `use` item: `use crate::b::x;`, `use crate::{a, b::c};`, `pub use crate::b::X;`, and
  `super::` paths that climb out of A (`use super::b::x;` in a top-level file);
- any other path in code: `crate::b::f(...)`, `crate::b::T` in a type, `$crate::b::` in a macro;
- an intra-doc link in a `///` or `//!` comment: `[`crate::b::T`]`, `[text](crate::b::T)`,
  `[text]: super::b`; and a path in a code span there (`` `crate::b::f` ``), which names B to
  a reader as much as a link does.

`crate::Name` where `Name` is an item the root re-exports (`pub use tcp::TcpCollective;` in
lib.rs) is an edge to the module that defines it. What is compiled only for tests is left out
unless `--tests` is given: an item under `#[cfg(test)]` (a `mod tests { ... }`, a `mod x;` and
the files it pulls in, a function, a `use`). With `--tests` it counts like any other code, and
its edges are marked `test` where places are listed (a test module of A that drives B is an
edge A -> B: reviewers read it as one). Whatever is outside src/ (tests/, benches/) is never
counted: it sees the crate from outside, as a user does.

It prints every strongly connected component of more than one module, each with one shortest
circle through it and every edge between its modules (file:line and kind), and exits 1 if there
is one. `--dot` prints the whole graph for Graphviz instead (the circles' edges in red); `--edges`
lists every edge with where it comes from.

    python3 scripts/import-graph.py                         # every crate in crates/, code only
    python3 scripts/import-graph.py --tests                 # test code counted too (what CI runs)
    python3 scripts/import-graph.py crates/silvic-net --dot   # one crate, for Graphviz

Why a script rather than `cargo modules dependencies --acyclic` (the cargo-modules crate): that
tool builds rust-analyzer's crates (hundreds of them, tens of minutes on CI's cores) and follows
the newest Rust (0.27 needs 1.95, 0.28 needs 1.98), too much for a check CI runs in a second; and
it draws items, where these layers are drawn per top-level module.
This script reads the source as text (a small lexer that blanks comments and literals), so it
does not expand macros or follow a name through a glob import; a path written out in full, as
this crate writes them, is what it sees.
"""

import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A path that starts at the crate root or climbs out of the module it is written in.
PATH_START = re.compile(r"(?<![A-Za-z0-9_$])(\$?crate|(?:super\s*::\s*)*super)\s*::\s*")
TEST_CFG = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:test|all\s*\([^\]]*\btest\b[^\]]*\))\s*\)\s*\]")
INNER_TEST_CFG = re.compile(r"#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
MOD_DECL = re.compile(r"\bmod\s+(" + IDENT + r")\s*;")
PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]\s*$')
USE_ITEM = re.compile(r"(?<![A-Za-z0-9_])(pub\s*(?:\([^)]*\))?\s*)?use\s[^;]*;")
# Doc references: intra-doc link targets (`[target]`, `[text](target)`, `[text]: target`) and
# paths in code spans (`` `crate::b` ``), which a reader follows as much as a link.
DOC_TARGETS = (
    re.compile(r"\]\(\s*<?([^)\s>]+)>?\s*\)"),
    re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)"),
    re.compile(r"\[([^\[\]]+)\]"),
    re.compile(r"`([^`]+)`"),
)
DOC_PATH = re.compile(
    r"^(?:\w+@)?(\$?crate|(?:super::)*super)::(" + IDENT + r")(?:::" + IDENT + r")*(?:\(\)|!)?$"
)


def blank(text, start, end):
    """`text` with [start, end) turned to spaces, newlines kept (so line numbers stay right)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def lex(text):
    """Splits Rust source into code and doc comments.

    Returns the code with every comment and string or char literal blanked, and the doc
    comments as (offset, text) pairs, one per `///` or `//!` line or `/** */` block.
    """
    code = list(text)
    docs = []
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if code[k] != "\n":
                code[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            if (text.startswith("///", i) and not text.startswith("////", i)) or text.startswith(
                "//!", i
            ):
                docs.append((i, text[i + 3 : end]))
            wipe(i, end)
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if text.startswith("/**", i) or text.startswith("/*!", i):
                docs.append((i, text[i + 3 : j - 2]))
            wipe(i, j)
            i = j
        elif c == '"' or (c in "rbc" and re.match(r"(?:b|c)?r#*\"|(?:b|c)\"", text[i:i + 8])):
            if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_") and c != '"':
                i += 1  # an identifier ending in r, b or c
                continue
            raw = re.match(r"(?:b|c)?r(#*)\"", text[i:i + 8])
            if raw:
                close = '"' + raw.group(1)
                j = text.find(close, i + raw.end())
                j = n if j < 0 else j + len(close)
            else:
                j = text.index('"', i) + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            wipe(i, j)
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime or label ('a), left as is.
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]*\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", text[i:i + 12])
            if m:
                wipe(i, i + m.end())
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(code), docs


def item_end(code, start):
    """Where the item that starts at `start` ends: after its `;` or its closing brace."""
    i = start
    while True:
        m = re.compile(r"\s*#\s*!?\s*\[").match(code, i)  # further attributes
        if not m:
            break
        i, depth = m.end(), 1
        while depth:
            depth += {"[": 1, "]": -1}.get(code[i], 0)
            i += 1
    is_use = re.compile(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?use\b").match(code, i)
    depth = 0
    while i < len(code):
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0 and not is_use:
            braces = 0
            while i < len(code):
                braces += {"{": 1, "}": -1}.get(code[i], 0)
                i += 1
                if braces == 0:
                    return i
        i += 1
    return len(code)


class Crate:
    """The files of a crate, each with its module path, code and doc comments.

    Without `tests`, test-only code is blanked and test-only files are not read; with it, both
    are kept and `spans` gives, per file, the [start, end) of its test-only code.
    """

    def __init__(self, crate_dir, tests=False):
        self.src = crate_dir / "src"
        root = self.src / "lib.rs"
        if not root.exists():
            root = self.src / "main.rs"
        self.root = root
        self.with_tests = tests
        self.files = {}  # path -> (module path as a tuple, code, docs)
        self.spans = {}  # path -> [(start, end)] of test-only code, kept with `tests`
        self.test_files = set()
        self.load(root, (), False)
        self.modules = sorted({m[0] for m, _, _ in self.files.values() if m})
        self.reexports = self.root_reexports()

    def load(self, path, module, is_test):
        text = path.read_text(encoding="utf-8")
        code, docs = lex(text)
        if INNER_TEST_CFG.search(code):
            is_test = True
        tests = []  # [start, end) of every item under #[cfg(test)]
        for m in TEST_CFG.finditer(code):
            tests.append((m.start(), item_end(code, m.end())))
        mod_rs = path.name in ("mod.rs", "lib.rs", "main.rs") or path == self.root
        for m in MOD_DECL.finditer(code):
            inside_test = is_test or any(a <= m.start() < b for a, b in tests)
            attrs = text[: m.start()].rstrip().splitlines()[-3:]
            explicit = next(filter(None, (PATH_ATTR.search(a) for a in reversed(attrs))), None)
            if explicit:
                child = path.parent / explicit.group(1)
            else:
                base = path.parent if mod_rs else path.parent / path.stem
                child = base / (m.group(1) + ".rs")
                if not child.exists():
                    child = base / m.group(1) / "mod.rs"
            if child.exists():
                self.load(child, module + (m.group(1),), inside_test)
        if is_test:
            self.test_files.add(path)
            tests = [(0, len(code))]
            if not self.with_tests:
                return
        if self.with_tests:
            self.spans[path] = tests
            self.files[path] = (module, code, docs)
            return
        for a, b in tests:
            code = blank(code, a, b)
        docs = [(o, d) for o, d in docs if not any(a <= o < b for a, b in tests)]
        self.files[path] = (module, code, docs)

    def root_reexports(self):
        """Names lib.rs re-exports, each with the top-level module that defines it."""
        _, code, _ = self.files[self.root]
        names = {}
        for m in USE_ITEM.finditer(code):
            if not m.group(1):
                continue
            body = " ".join(m.group(0)[m.group(0).index("use") + 3 : -1].split())
            body = re.sub(r"^(?:crate|self)\s*::\s*", "", body)
            top = re.match(IDENT, body)
            if not top or top.group(0) not in self.modules:
                continue
            # Each leaf of the tree is a path whose last name (or its `as` alias) is exported.
            for leaf in re.split(r"[{},]", body[top.end() :]):
                leaf = re.split(r"\bas\b|::", leaf)[-1].strip()
                if re.fullmatch(IDENT, leaf) and leaf != "self":
                    names[leaf] = top.group(0)
        return names

    def top_of(self, name):
        """The top-level module a name at the crate root belongs to, if it is the crate's."""
        if name in self.modules:
            return name
        return self.reexports.get(name)


def resolve(module, prefix):
    """The module path a `crate`/`super` prefix names, seen from `module`; None above the root."""
    if "crate" in prefix:
        return ()
    ups = prefix.count("super")
    if ups > len(module):
        return None
    return module[: len(module) - ups]


def group_heads(code, start):
    """The first name of each entry of the `{ ... }` group that opens at `start`."""
    depth, i, entry, heads = 0, start, "", []
    while i < len(code):
        c = code[i]
        if c == "{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                heads.append(entry)
                break
        if depth == 1 and c == ",":
            heads.append(entry)
            entry = ""
        elif depth >= 1:
            entry += c
        i += 1
    names = []
    for entry in heads:
        m = re.match(r"\s*(" + IDENT + ")", entry)
        if m:
            names.append(m.group(1))
    return names


def references(crate):
    """Every reference from one top-level module to another: (from, to, file, line, kind)."""
    found = []
    for path, (module, code, docs) in sorted(crate.files.items()):
        if not module:
            continue  # the root
        here = module[0]
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        uses = [(m.start(), m.end(), bool(m.group(1))) for m in USE_ITEM.finditer(code)]
        spans = crate.spans.get(path, [])

        def add(target_base, names, offset, kind):
            if any(a <= offset < b for a, b in spans):
                kind += ", test"
            for name in names:
                top = target_base[0] if target_base else crate.top_of(name)
                if top and top != here:
                    line = code.count("\n", 0, offset) + 1
                    found.append((here, top, f"{rel}:{line}", kind))

        for m in PATH_START.finditer(code):
            base = resolve(module, m.group(1))
            if base is None:
                continue
            kind = "path"
            for a, b, public in uses:
                if a <= m.start() < b:
                    kind = "pub use" if public else "use"
            if code.startswith("{", m.end()):
                add(base, group_heads(code, m.end()), m.start(), kind)
            else:
                name = re.match(IDENT, code[m.end():])
                if name:
                    add(base, [name.group(0)], m.start(), kind)
        for offset, doc in docs:
            for line in doc.split("\n"):
                targets = {t for pattern in DOC_TARGETS for t in pattern.findall(line)}
                for target in targets:
                    link = DOC_PATH.match(target.strip().strip("`"))
                    if not link:
                        continue
                    base = resolve(module, link.group(1))
                    if base is not None:
                        add(base, [link.group(2)], offset, "doc")
                offset += len(line) + 1
    return found


def strongly_connected(nodes, edges):
    """Tarjan's algorithm: the strongly connected components of the graph."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return components


def shortest_circle(component, edges):
    """One shortest circle through the component's first module, by breadth-first search."""
    start = component[0]
    parents, queue = {start: None}, collections.deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return path[::-1] + [start]
            if w in component and w not in parents:
                parents[w] = v
                queue.append(w)
    return [start]


def check(crate_dir, dot, list_edges, tests):
    """Prints the crate's circles (and its graph or edges if asked); True if it has none."""
    crate = Crate(crate_dir, tests)
    places = collections.defaultdict(list)
    for a, b, where, kind in references(crate):
        if f"{where} ({kind})" not in places[(a, b)]:
            places[(a, b)].append(f"{where} ({kind})")
    edges = collections.defaultdict(set)
    for a, b in places:
        edges[a].add(b)
    circles = [c for c in strongly_connected(crate.modules, edges) if len(c) > 1]
    in_circle = {(a, b) for c in circles for a in c for b in c if (a, b) in places}
    name = crate_dir.relative_to(ROOT) if crate_dir.is_relative_to(ROOT) else crate_dir
    counted = " (test code counted)" if tests else ""

    if dot:
        print(f'digraph "{name}" {{')
        for m in crate.modules:
            print(f'  "{m}";')
        for (a, b), where in sorted(places.items()):
            colour = ' color="red"' if (a, b) in in_circle else ""
            print(f'  "{a}" -> "{b}" [label="{len(where)}"{colour}];')
        print("}")
        return not circles
    if list_edges:
        for (a, b), where in sorted(places.items()):
            print(f"{name}: {a} -> {b}: " + ", ".join(where))
    if not circles:
        print(f"{name}: {len(crate.modules)} modules, {len(places)} edges, no circle{counted}")
    for component in circles:
        print(f"{name}: circle among {', '.join(component)}{counted}")
        print("  shortest: " + " -> ".join(shortest_circle(component, edges)))
        for (a, b), where in sorted(places.items()):
            if (a, b) in in_circle and a in component:
                print(f"  {a} -> {b}: " + ", ".join(where))
    return not circles


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("crates", nargs="*", help="crate folders (default: every one in crates/)")
    parser.add_argument("--dot", action="store_true", help="print each graph for Graphviz")
    parser.add_argument("--edges", action="store_true", help="list every edge and its places")
    parser.add_argument(
        "--tests", action="store_true", help="count #[cfg(test)] code and the files it pulls in"
    )
    args = parser.parse_args()
    if args.crates:
        folders = [pathlib.Path(c).resolve() for c in args.crates]
    else:
        folders = sorted(p.parent.parent for p in (ROOT / "crates").glob("*/src/lib.rs"))
        folders += sorted(
            p.parent.parent
            for p in (ROOT / "crates").glob("*/src/main.rs")
            if not (p.parent / "lib.rs").exists()
        )
    results = [check(folder, args.dot, args.edges, args.tests) for folder in folders]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
