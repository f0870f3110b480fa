#!/usr/bin/env python3
"""Import circles between the modules of a crate.

Reads every .rs file under each SRC directory given, takes each module's `crate::a::b` paths
(comments and the `#[cfg(test)] mod tests` at a file's end left out: a doc link or a test's
use of another module is no dependency of the code) and prints every strongly connected
set of two or more modules, with the edges inside it. Exits 1 when it found one.

    scripts/module-cycles.py ibverbs/src stack/src ...
"""
import os
import re
import sys


def modules(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)[:-3]
            if rel.endswith("/mod"):
                rel = rel[: -len("/mod")]
            src = open(path).read()
            cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests\b", src, re.M)
            if cut:
                src = src[: cut.start()]
            src = "\n".join(l for l in src.split("\n") if not l.strip().startswith("//"))
            mods[rel.replace("/", "::")] = src
    return mods


def edges_of(mods):
    edges = {m: set() for m in mods}

    def add(m, path):
        parts = path.split("::")
        for i in range(len(parts), 0, -1):
            cand = "::".join(parts[:i])
            if cand in mods:
                if cand != m:
                    edges[m].add(cand)
                return

    for m, src in mods.items():
        for p in re.findall(r"crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)", src):
            add(m, p)
        for group in re.findall(r"use crate::\{([^;]*)\};", src, re.S):
            for item in re.split(r",\s*(?![^{]*\})", group):
                head = re.match(r"\s*([a-z_0-9]+(?:::[a-z_0-9]+)*)", item)
                if head:
                    add(m, head.group(1))
    return edges


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


found = False
for root in sys.argv[1:]:
    mods = modules(root)
    edges = edges_of(mods)
    circles = cycles(edges)
    for comp in circles:
        print(f"{root}: an import circle of {len(comp)} modules")
        for m in comp:
            print(f"    {m} -> {', '.join(sorted(e for e in edges[m] if e in comp))}")
    if not circles:
        print(f"{root}: {len(mods)} modules, no import circle")
    found = found or bool(circles)
sys.exit(1 if found else 0)
