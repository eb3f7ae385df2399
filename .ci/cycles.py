#!/usr/bin/env python3
"""Import cycles among the files of each folder of src/ (one node per sibling module).

Usage: python3 .ci/cycles.py [ROOT, default src] [-v]; exits 1 if a folder has a cycle,
and says which files form it. With -v, also lists the folders without one.

An edge A -> B: file A names sibling B, by `super::B`, `crate::<folder>::B`, or a name the
folder's mod.rs defines (edge to mod.rs) or re-imports from B (`use B::{..}` in mod.rs:
edge to B). mod.rs -> B for each `B::` path or `use B::` in mod.rs. Comments are ignored.
"""
import os, re, sys

args = [a for a in sys.argv[1:] if a != "-v"]
root = args[0] if args else "src"

def strip_comments(t):
    t = re.sub(r"/\*.*?\*/", "", t, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", l) for l in t.splitlines())

def modules(folder):
    """sibling module name -> list of files (a subfolder module: all its files)."""
    mods = {}
    for f in os.listdir(folder):
        p = os.path.join(folder, f)
        if f.endswith(".rs") and f not in ("mod.rs", "lib.rs", "main.rs"):
            mods.setdefault(f[:-3], []).append(p)
        elif os.path.isdir(p):
            for dp, _, fs in os.walk(p):
                for g in fs:
                    if g.endswith(".rs"):
                        mods.setdefault(f, []).append(os.path.join(dp, g))
    return mods

def parent_file(folder):
    for c in (os.path.join(folder, "mod.rs"), folder + ".rs", os.path.join(folder, "lib.rs")):
        if os.path.exists(c):
            return c

def lift_inline_modules(text):
    """Inside an inline `mod x { .. }`, `super::` names the file's own module: rewrite its
    paths as the file would write them (`super::super::a` -> `super::a`, `super::a` ->
    `self::a`), so its uses count as the file's."""
    out, i = [], 0
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        if m.start() < i: continue
        depth, j = 0, m.end() - 1
        while j < len(text):
            if text[j] == "{": depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0: break
            j += 1
        inner = lift_inline_modules(text[m.end():j])
        inner = re.sub(r"\bsuper::(?!super::)", "self::", inner)
        inner = inner.replace("super::super::", "super::")
        out.append(text[i:m.end()] + inner)
        i = j
    out.append(text[i:])
    return "".join(out)

def expand_use(text):
    """Every path named in `use` trees and inline paths, as 'a::b::c' strings."""
    paths = set()
    for m in re.finditer(r"\buse\s+([^;]+);", text, flags=re.S):
        for p in flatten(m.group(1).replace("\n", " ")):
            paths.add(p)
    for m in re.finditer(r"\b((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
        paths.add(m.group(1))
    return paths

def flatten(tree, prefix=""):
    tree = tree.strip()
    out = []
    depth, start, parts = 0, 0, []
    # split top-level commas
    for i, ch in enumerate(tree):
        if ch == "{": depth += 1
        elif ch == "}": depth -= 1
        elif ch == "," and depth == 0:
            parts.append(tree[start:i]); start = i + 1
    parts.append(tree[start:])
    for part in parts:
        part = part.strip()
        if not part: continue
        if "{" in part:
            head = part[:part.index("{")].rstrip(":").strip()
            inner = part[part.index("{") + 1: part.rindex("}")]
            out += flatten(inner, prefix + head + "::" if head else prefix)
        else:
            part = re.sub(r"\s+as\s+\w+$", "", part)
            out.append(prefix + part)
    return out

def module_path(folder):
    """The folder's module path, from the crate's `src`."""
    parts = os.path.normpath(os.path.abspath(folder)).split(os.sep)
    rel = parts[len(parts) - parts[::-1].index("src"):]
    return "::".join(["crate"] + rel)

found = False
folders = [dp for dp, _, _ in os.walk(root)]
for folder in sorted(folders):
    mods = modules(folder)
    if len(mods) < 2: continue
    parent = parent_file(folder)
    mpath = module_path(folder)
    # names re-imported by the parent from a child
    reexp = {}
    if parent:
        ptext = strip_comments(open(parent).read())
        for m in re.finditer(r"\buse\s+([^;]+);", ptext, flags=re.S):
            for p in flatten(m.group(1).replace("\n", " ")):
                segs = [s for s in p.split("::") if s != "self"]
                if segs and segs[0] in mods and len(segs) >= 2:
                    reexp[segs[-1]] = segs[0]
    parent_defines = bool(parent) and bool(re.search(
        r"^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(fn|struct|enum|trait|const|static|type|impl|macro_rules!)\b",
        strip_comments(open(parent).read()), flags=re.M))
    edges = {}
    def add(a, b):
        if a != b: edges.setdefault(a, set()).add(b)
    for name, files in mods.items():
        for f in files:
            text = lift_inline_modules(strip_comments(open(f).read()))
            depth = os.path.relpath(f, folder).count(os.sep)  # 0: direct child file
            sup = "super::" * (depth + 1)
            for p in expand_use(text):
                rest = None
                if p.startswith(mpath + "::"): rest = p[len(mpath) + 2:]
                elif p.startswith(sup) and not p.startswith(sup + "super::"): rest = p[len(sup):]
                if rest is None: continue
                head = rest.split("::")[0]
                if head in mods: add(name, head)
                elif head in reexp: add(name, reexp[head])
                elif head == "*":
                    # a glob of the parent: the children whose re-exported names this
                    # file uses, and the parent itself if it defines items of its own
                    for n, child in reexp.items():
                        if re.search(r"\b" + re.escape(n) + r"\b", text): add(name, child)
                    if parent_defines: add(name, "mod")
                elif head != "self": add(name, "mod")
    if parent:
        for p in expand_use(strip_comments(open(parent).read())):
            segs = [s for s in p.split("::") if s not in ("self",)]
            if mpath != "crate" and p.startswith(mpath + "::"): segs = p[len(mpath) + 2:].split("::")
            if segs and segs[0] in mods: add("mod", segs[0])
    # cycles: Tarjan SCC
    idx, low, on, st, out, n = {}, {}, set(), [], [], [0]
    def sc(v):
        idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in idx: sc(v)
    rel = os.path.relpath(folder, ".")
    if out:
        found = True
        for comp in out:
            detail = "; ".join(f"{a}->{b}" for a in comp for b in sorted(edges.get(a, ())) if b in comp)
            print(f"{rel}: cycle among {comp}: {detail}")
    elif "-v" in sys.argv:
        print(f"{rel}: no cycle ({sum(len(v) for v in edges.values())} edges)")
sys.exit(1 if found else 0)
