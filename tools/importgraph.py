"""Static import graph of grudge_stream: modules, module-level edges, cycles at module level, and
counting every import (inside functions and in `TYPE_CHECKING` blocks too: a type-only import is
still a dependency a reader follows). Also the longest modules.

Usage: python tools/importgraph.py [CHECKOUT] [--edges]
"""
import ast
import os
import sys

args = [a for a in sys.argv[1:] if a != "--edges"]
root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pkgdir = os.path.join(root, "grudge_stream")
mods = {}
for dp, dn, fn in os.walk(pkgdir):
    dn[:] = [d for d in dn if d != "__pycache__"]
    for f in fn:
        if f.endswith(".py"):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3].replace(os.sep, ".")
            if rel.endswith(".__init__"): rel = rel[:-9]
            mods[rel] = p
def resolve(name):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None
top, allE = {}, {}
for m, p in mods.items():
    tree = ast.parse(open(p).read())
    ispkg = p.endswith("__init__.py")
    t, a = set(), set()
    def add(target, toplevel):
        r = resolve(target)
        if r and r != m:
            a.add(r)
            if toplevel: t.add(r)
    def visit(node, toplevel):
        for ch in ast.iter_child_nodes(node):
            tl = toplevel and not isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.If) and isinstance(ch.test, ast.Name) and ch.test.id == "TYPE_CHECKING":
                tl = False  # type-only: counted with the function-level imports
            if isinstance(ch, ast.Import):
                for al in ch.names: add(al.name, toplevel)
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    parts = m.split(".") if ispkg else m.split(".")[:-1]
                    parts = parts[:len(parts) - (ch.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for al in ch.names:
                    add(base + "." + al.name if resolve(base + "." + al.name) == base + "." + al.name else base, toplevel)
            visit(ch, tl)
    visit(tree, True)
    top[m], allE[m] = t, a
def cycles(E):
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in E.get(v, ()):
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in E:
        if v not in idx: sc(v)
    return out
print(f"modules {len(mods)}; module-level edges {sum(map(len, top.values()))}; all edges {sum(map(len, allE.values()))}")
print("module-level cycles:", cycles(top) or "none")
print("cycles counting function-level and type-only imports:", cycles(allE) or "none")
sizes = sorted(((sum(1 for _ in open(p)), m) for m, p in mods.items()), reverse=True)
print("longest modules:", ", ".join(f"{m} {n}" for n, m in sizes[:6]))
if "--edges" in sys.argv:
    for m in sorted(top): print(m, "->", ", ".join(sorted(top[m])))
