#!/usr/bin/env python3
"""The crate's public API as a sorted list of paths, checked against `tests/public-api.txt`.

    python3 scripts/public_api.py           # check: exit 1 with a diff if the API changed
    python3 scripts/public_api.py --bless   # rewrite tests/public-api.txt

It builds rustdoc's JSON output of the library with the default features plus `cuda`-free
extras (`cargo rustdoc --lib`, on stable through `RUSTC_BOOTSTRAP=1`, since the JSON format is
still unstable), walks the module tree from the crate root through every public module and
re-export, and writes one line per public item: its path, its kind, and for structs, enums
and traits their public fields, variants and associated items. A change to the public
surface is then a visible diff in review.

It also checks that every item is reachable by exactly one path (the prelude, which only
gathers items, aside): a second path to an item is an error.
"""
import json
import re
import shlex
import os
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "tests", "public-api.txt")
# The crate's own items that the listed signatures name, as (id, path as written).
REFERENCED = set()
FEATURES = "tinker,local,parquet,hub,plot,chat-template,weights,tensorboard"  # the default set


def build_json():
    """`cargo doc --no-deps` with warnings denied, then the same rustdoc command again with
    JSON output. The JSON run is the exact command cargo ran for the HTML docs, repeated by
    hand with `RUSTC_BOOTSTRAP=1` in its environment only: setting that variable for cargo
    itself would rebuild every dependency (their build scripts watch it)."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    env = dict(os.environ)
    env["RUSTDOCFLAGS"] = (env.get("RUSTDOCFLAGS", "") + " -D warnings").strip()
    # Touch the crate root so that cargo runs (and prints) rustdoc even when the docs are
    # up to date.
    os.utime(os.path.join(ROOT, "src", "lib.rs"))
    proc = subprocess.run(
        ["cargo", "doc", "--no-deps", "--lib", "-vv", "--features", FEATURES],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write("".join(l + "\n" for l in proc.stdout.splitlines()
                             if not l.lstrip().startswith(("Running `", "Fresh ", "Dirty ", "["))))
    if proc.returncode != 0:
        sys.exit("public_api.py: `cargo doc --no-deps` failed (warnings are errors)")
    command = None
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("Running `") and "--crate-name rlvr " in line and "rustdoc" in line:
            command = line[len("Running `"):-1]
    if command is None:
        sys.exit("public_api.py: cargo did not print the rustdoc command")
    out = os.path.join(target, "public-api")
    os.makedirs(out, exist_ok=True)
    command = re.sub(r" -o \S+", " -o " + shlex.quote(out), command, count=1)
    command = re.sub(r" --error-format=json --json=\S+", "", command)
    subprocess.run(
        command + " -Z unstable-options --output-format json",
        shell=True, cwd=ROOT, env=dict(os.environ, RUSTC_BOOTSTRAP="1"), check=True)
    with open(os.path.join(out, "rlvr.json")) as f:
        return json.load(f)


def ty(t):
    """A rustdoc JSON type as Rust source (paths by their last segment)."""
    if t is None:
        return "()"
    (k, v), = t.items()
    if k == "resolved_path":
        REFERENCED.add((str(v.get("id")), v.get("path") or v.get("name")))
        name = (v.get("path") or v.get("name") or "?").split("::")[-1]
        return name + args(v.get("args"))
    if k == "generic":
        return v
    if k == "primitive":
        return v
    if k == "tuple":
        return "(" + ", ".join(ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if k == "slice":
        return "[" + ty(v) + "]"
    if k == "array":
        return f"[{ty(v['type'])}; {v['len']}]"
    if k == "borrowed_ref":
        lt = (v.get("lifetime") + " ") if v.get("lifetime") else ""
        return "&" + lt + ("mut " if v.get("is_mutable") else "") + ty(v["type"])
    if k == "raw_pointer":
        return ("*mut " if v.get("is_mutable") else "*const ") + ty(v["type"])
    if k == "impl_trait":
        return "impl " + " + ".join(bound(b) for b in v)
    if k == "dyn_trait":
        parts = [path(p["trait"]) for p in v.get("traits", [])]
        if v.get("lifetime"):
            parts.append(v["lifetime"])
        return "dyn " + " + ".join(parts)
    if k == "qualified_path":
        tr = v.get("trait")
        base = f"<{ty(v['self_type'])} as {path(tr)}>" if tr else ty(v["self_type"])
        return f"{base}::{v['name']}"
    if k == "function_pointer":
        sig = v.get("sig") or v.get("decl")
        return "fn(" + ", ".join(ty(x[1]) for x in sig["inputs"]) + ")" + ret(sig.get("output"))
    if k == "infer":
        return "_"
    return k


def path(p):
    if p is None:
        return "?"
    REFERENCED.add((str(p.get("id")), p.get("path") or p.get("name")))
    return (p.get("path") or p.get("name") or "?").split("::")[-1] + args(p.get("args"))


def args(a):
    if not a:
        return ""
    if "angle_bracketed" in a:
        ab = a["angle_bracketed"]
        items = []
        for x in ab.get("args", []):
            (k, v), = x.items()
            items.append(ty(v) if k == "type" else (v if isinstance(v, str) else str(v)))
        for c in ab.get("constraints", []):
            binding = c.get("binding", {})
            if "equality" in binding:
                eq = binding["equality"]
                items.append(f"{c['name']} = " + (ty(eq["type"]) if "type" in eq else str(eq)))
            else:
                items.append(f"{c['name']}: " + " + ".join(bound(b) for b in binding.get("constraint", [])))
        return "<" + ", ".join(items) + ">" if items else ""
    if "parenthesized" in a:
        p = a["parenthesized"]
        return "(" + ", ".join(ty(x) for x in p.get("inputs", [])) + ")" + ret(p.get("output"))
    return ""


def ret(t):
    return "" if t is None else " -> " + ty(t)


def bound(b):
    (k, v), = b.items()
    if k == "trait_bound":
        m = {"maybe": "?", "maybe_const": "~const "}.get(v.get("modifier"), "")
        return m + path(v["trait"])
    if k == "outlives":
        return v
    return k


def generics(g):
    ps = []
    for p in (g or {}).get("params", []):
        kind = p.get("kind", {})
        if "lifetime" in kind:
            ps.append(p["name"])
        elif "type" in kind:
            if kind["type"].get("is_synthetic"):
                continue
            bs = kind["type"].get("bounds", [])
            ps.append(p["name"] + (": " + " + ".join(bound(b) for b in bs) if bs else ""))
        elif "const" in kind:
            ps.append(f"const {p['name']}: {ty(kind['const']['type'])}")
    wh = []
    for w in (g or {}).get("where_predicates", []):
        if "bound_predicate" in w:
            bp = w["bound_predicate"]
            wh.append(ty(bp["type"]) + ": " + " + ".join(bound(b) for b in bp.get("bounds", [])))
    return ("<" + ", ".join(ps) + ">" if ps else ""), (" where " + ", ".join(wh) if wh else "")


def signature(kind, data):
    """What follows an item's path and kind in the listing: its type or signature."""
    if not isinstance(data, dict):
        return ""
    if kind == "function":
        sig = data.get("sig") or data.get("decl")
        h = data.get("header", {})
        pre = ("const " if h.get("is_const") else "") + ("async " if h.get("is_async") else "") + \
            ("unsafe " if h.get("is_unsafe") else "")
        gp, wh = generics(data.get("generics"))
        ins = []
        for name, t in sig["inputs"]:
            if name == "self":
                br = t.get("borrowed_ref") if isinstance(t, dict) else None
                if t == {"generic": "Self"}:
                    ins.append("self")
                elif br and br.get("type") == {"generic": "Self"}:
                    ins.append("&mut self" if br.get("is_mutable") else "&self")
                else:
                    ins.append(f"self: {ty(t)}")
            else:
                ins.append(f"{name}: {ty(t)}")
        return f" {pre}fn{gp}(" + ", ".join(ins) + ")" + ret(sig.get("output")) + wh
    if kind in ("struct_field", "constant", "static", "type_alias", "assoc_const", "assoc_type"):
        t = data if kind == "struct_field" else data.get("type")
        return ": " + ty(t) if t else ""
    return ""


def inner_kind(item):
    inner = item["inner"]
    if isinstance(inner, str):
        return inner, None
    (kind, data), = inner.items()
    return kind, data


def is_public(item):
    return item.get("visibility") == "public"


class Walker:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.lines = set()
        self.paths_of = defaultdict(set)  # item id -> paths (outside the prelude)

    def item(self, id_):
        return self.index.get(str(id_))

    def add(self, path, kind, id_, in_prelude, data=None):
        self.lines.add(f"{path} ({kind}){signature(kind, data)}")
        if not in_prelude and id_ is not None:
            self.paths_of[str(id_)].add(path)

    def members(self, path, kind, data):
        """Fields, variants and associated items of a struct, enum or trait."""
        ids = []
        if kind == "struct":
            k = data.get("kind", {})
            if isinstance(k, dict):
                plain = k.get("plain") or {}
                ids += plain.get("fields", [])
                ids += [f for f in (k.get("tuple") or []) if f is not None]
            ids_impl = data.get("impls", [])
        elif kind == "enum":
            ids += data.get("variants", [])
            ids_impl = data.get("impls", [])
        elif kind == "trait":
            ids += data.get("items", [])
            ids_impl = []
        else:
            ids_impl = data.get("impls", []) if isinstance(data, dict) else []
        for i in ids:
            it = self.item(i)
            if it is None:
                continue
            k, d = inner_kind(it)
            if kind == "struct" and not is_public(it):
                continue
            name = it.get("name") or "?"
            self.lines.add(f"{path}::{name} ({k}){signature(k, d)}")
        for i in ids_impl:
            imp = self.item(i)
            if imp is None:
                continue
            _, idata = inner_kind(imp)
            if idata.get("trait") is not None or idata.get("is_synthetic") or idata.get("blanket_impl"):
                continue
            for a in idata.get("items", []):
                it = self.item(a)
                if it is None or not is_public(it):
                    continue
                k, d = inner_kind(it)
                self.lines.add(f"{path}::{it['name']} ({k}){signature(k, d)}")

    def walk_module(self, path, mod_id, in_prelude, seen):
        if (mod_id, path) in seen:
            return
        seen.add((mod_id, path))
        mod = self.item(mod_id)
        _, data = inner_kind(mod)
        for child in data.get("items", []):
            it = self.item(child)
            if it is None or not is_public(it):
                continue
            kind, cdata = inner_kind(it)
            if kind in ("use", "import"):
                target = cdata.get("id")
                name = cdata.get("name")
                if cdata.get("is_glob") or cdata.get("glob"):
                    if target is not None and self.item(target) is not None:
                        self.glob_reexports.append(f"{path}: {cdata.get('source')}")
                        self.walk_module(path, target, in_prelude, seen)
                    continue
                sub = f"{path}::{name}"
                tit = self.item(target) if target is not None else None
                if tit is None:
                    self.lines.add(f"{sub} (re-export of {cdata.get('source')})")
                    continue
                tkind, tdata = inner_kind(tit)
                if tkind == "module":
                    self.add(sub, "module", target, in_prelude)
                    self.walk_module(sub, target, in_prelude or name == "prelude", seen)
                else:
                    self.add(sub, tkind, target, in_prelude, tdata)
                    if not in_prelude:
                        self.members(sub, tkind, tdata)
                continue
            name = it.get("name")
            sub = f"{path}::{name}"
            if kind == "module":
                self.add(sub, "module", child, in_prelude)
                self.walk_module(sub, child, in_prelude or name == "prelude", seen)
            elif kind == "impl":
                continue
            else:
                self.add(sub, kind, child, in_prelude, cdata)
                if not in_prelude:
                    self.members(sub, kind, cdata)

    def run(self):
        self.glob_reexports = []
        root = self.doc["root"]
        self.walk_module("rlvr", root, False, set())
        return sorted(self.lines)


def main():
    doc = build_json()
    w = Walker(doc)
    lines = w.run()
    problems = []
    for id_, paths in sorted(w.paths_of.items()):
        if len(paths) > 1:
            problems.append("more than one path to one item: " + ", ".join(sorted(paths)))
    # Members (methods, fields, variants) are reachable through their owner.
    members = ("function", "assoc_type", "assoc_const", "struct_field", "variant")
    reachable = set(w.paths_of) | {
        i for i, it in w.index.items() if is_public(it) and inner_kind(it)[0] in members}
    for id_, written in sorted(REFERENCED, key=lambda r: (r[0], r[1] or "")):
        it = w.index.get(id_)
        if (it is not None and it.get("crate_id") == 0 and id_ not in reachable
                and inner_kind(it)[0] in ("struct", "enum", "trait", "type_alias", "union")):
            problems.append(f"a public signature names `{written}`, which is not reachable")
    if w.glob_reexports:
        problems += [f"glob re-export of a module: {g}" for g in w.glob_reexports]
    text = "".join(l + "\n" for l in lines)
    if "--bless" in sys.argv:
        with open(SNAPSHOT, "w") as f:
            f.write(text)
        print(f"tests/public-api.txt: {len(lines)} lines")
    else:
        old = open(SNAPSHOT).read() if os.path.exists(SNAPSHOT) else ""
        if old != text:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), "tests/public-api.txt", "the code"))
            problems.append("the public API differs from tests/public-api.txt "
                            "(run `python3 scripts/public_api.py --bless` and commit it)")
    for p in problems:
        print("public_api.py: " + p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"public API: {len(lines)} items, each by one path; matches tests/public-api.txt")


if __name__ == "__main__":
    main()
