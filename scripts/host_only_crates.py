#!/usr/bin/env python3
"""The dependency graph's host-only crates: proc macros, build-script dependencies and what
only they use (never linked into the library, a test or an example).

    python3 scripts/host_only_crates.py          # print them
    python3 scripts/host_only_crates.py --check  # exit 1 unless Cargo.toml's dev profile
                                                 # lists exactly these at opt-level 0

Cargo.toml keeps them unoptimized in dev/test builds (see the comment above the list there);
the check keeps that list in step with Cargo.lock.
"""
import json
import re
import subprocess
import sys

# Platform crates the resolve lists but a Linux build never compiles.
FOREIGN = re.compile(r"^(windows|wasm-bindgen)")


def host_only():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--quiet"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    def proc_macro(pid):
        return any("proc-macro" in t["kind"] for t in packages[pid]["targets"])

    # Everything reachable from the root through normal and dev edges without entering a
    # proc macro is linked into some target binary.
    target, stack = set(), [meta["resolve"]["root"]]
    while stack:
        pid = stack.pop()
        if pid in target:
            continue
        target.add(pid)
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if kinds & {None, "dev"} and not proc_macro(dep["pkg"]):
                stack.append(dep["pkg"])
    names = {packages[pid]["name"] for pid in nodes if pid not in target}
    linked = {packages[pid]["name"] for pid in target}
    return sorted(n for n in names - linked if not FOREIGN.match(n))


def listed():
    """The crates of Cargo.toml's block that names this script (up to the next comment)."""
    lines = open("Cargo.toml", encoding="utf-8").read().splitlines()
    start = next(i for i, l in enumerate(lines) if "scripts/host_only_crates.py" in l)
    names = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        m = re.match(r'^\[profile\.dev\.package\."?([A-Za-z0-9_-]+)"?\]$', line)
        if m:
            names.append(m.group(1))
    return names


def main():
    crates = host_only()
    if "--check" not in sys.argv[1:]:
        print("\n".join(crates))
        return 0
    names = listed()
    missing = [c for c in crates if c not in names]
    extra = [c for c in names if c not in crates]
    if missing or extra:
        print("Cargo.toml's list of host-only crates is out of date: missing "
              f"{', '.join(missing) or 'none'}; not host-only {', '.join(extra) or 'none'}",
              file=sys.stderr)
        return 1
    print(f"host-only crates: {len(crates)}, all unoptimized in dev builds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
