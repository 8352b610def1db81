#!/usr/bin/env python3
"""A new app package that follows the README: every documented snippet, compiled and run as written.

Reads the `swift` blocks of README.md and docs/logging.md. Each must be marked, on the line
before it, either

    <!-- manifest -->                    the install snippet: a whole Package.swift, or
    <!-- snippet: NAME [run]             code an app writes; the lines up to `-->` are a
    PRELUDE                              prelude that declares what the snippet uses but
    -->                                  does not show (global declarations)

(an unmarked block fails: nothing documented goes unchecked). Nothing in a block is changed:

- The install snippets must be the same text. It is the new package's Package.swift, as
  written, in `DIR/OvenControl`, beside `DIR/dredge` (this repository): the snippet's own
  path dependency `../dredge` and package name `dredge` are what is built. Below it this script
  appends (it never edits) one executable target per snippet beyond the first.
- Each snippet is the `main.swift` of its own executable, as written: its imports are its own.
  The README's first snippet is the manifest's `OvenControl` target; the others are targets
  `Snippet<Name>`. The prelude goes into `Prelude.swift` beside it (with its own imports of
  DredgeLogging and Foundation, which do not reach `main.swift`: Swift imports are per file).

It builds the package with a fresh `.build`, runs the snippets marked `run` (each in its own
process, with a temporary directory it removes as TMPDIR), and prints what an app developer pays:

    figure: client.fresh_app value=N packages limit=8 ratio=R first_build_s=S checkout_mb=M

Exit status 1 when a snippet does not compile or fails, or the manifest snippets differ.
Usage: scripts/fresh-app.py [--keep DIR]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "docs/logging.md"]
MARKER = re.compile(r"<!-- (manifest|snippet: ([a-z0-9-]+)( run)?)\n?(.*?)-->\s*\n```swift\n(.*?)```", re.S)
PRELUDE_IMPORTS = "import DredgeLogging\nimport Foundation\n#if canImport(FoundationNetworking)\nimport FoundationNetworking\n#endif\n"


def blocks():
    manifests, snippets = [], []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        marked = set()
        for m in MARKER.finditer(text):
            marked.add(m.start(5))
            if m.group(1) == "manifest":
                manifests.append((doc, m.group(5)))
            else:
                snippets.append({"doc": doc, "name": m.group(2), "run": bool(m.group(3)), "prelude": m.group(4), "code": m.group(5)})
        for m in re.finditer(r"```swift\n", text):
            if m.end() not in marked:
                line = text.count("\n", 0, m.start()) + 1
                sys.exit(f"{doc}:{line}: a swift block without a <!-- manifest --> or <!-- snippet: … --> marker")
    names = [s["name"] for s in snippets]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        sys.exit(f"snippet names used twice: {sorted(duplicates)}")
    if not manifests:
        sys.exit("no <!-- manifest --> block")
    if len({m[1] for m in manifests}) != 1:
        sys.exit("the install snippets differ: " + ", ".join(m[0] for m in manifests))
    if not snippets or snippets[0]["doc"] != "README.md":
        sys.exit("the README's first swift snippet is the app the install snippet's target builds")
    return manifests[0][1], snippets


def target(snippet, index):
    """The executable target a snippet is the main.swift of: the manifest's own for the first."""
    return "OvenControl" if index == 0 else "Snippet" + "".join(part.capitalize() for part in snippet["name"].split("-"))


def main():
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    manifest, snippets = blocks()
    if '.package(path: "../dredge"' not in manifest or 'package: "dredge"' not in manifest:
        sys.exit('the install snippet depends on a checkout beside the app: .package(path: "../dredge" …) and package: "dredge"')
    work = keep or tempfile.mkdtemp(prefix="dredge-fresh-app-")
    if keep:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    scratch = tempfile.mkdtemp(prefix="dredge-fresh-app-run-")
    try:
        os.symlink(ROOT, os.path.join(work, "dredge"))
        app = os.path.join(work, "OvenControl")
        extra = [target(s, i) for i, s in enumerate(snippets) if i > 0]
        os.makedirs(app)
        with open(os.path.join(app, "Package.swift"), "w") as f:
            f.write(manifest)
            f.write("\n// Appended by scripts/fresh-app.py: one executable per documented snippet beyond the README's.\npackage.targets += [\n")
            for name in extra:
                f.write(f'    .executableTarget(name: "{name}", dependencies: [.product(name: "DredgeLogging", package: "dredge")]),\n')
            f.write("]\n")
        runs = []
        for i, snippet in enumerate(snippets):
            name = target(snippet, i)
            sources = os.path.join(app, "Sources", name)
            os.makedirs(sources)
            with open(os.path.join(sources, "main.swift"), "w") as f:
                f.write(snippet["code"])
            with open(os.path.join(sources, "Prelude.swift"), "w") as f:
                f.write(f"// {snippet['doc']}, snippet {snippet['name']}: what it uses but does not show.\n" + PRELUDE_IMPORTS + "\n" + snippet["prelude"])
            if snippet["run"]:
                runs.append((snippet["name"], name))
        start = time.monotonic()
        build = subprocess.run(["swift", "build"], cwd=app, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if build.returncode != 0:
            errors = list(dict.fromkeys(l for l in (build.stdout + build.stderr).splitlines() if re.match(r"^/.*error:", l)))
            sys.exit("the documented snippets do not build:\n" + "\n".join(errors[:40] or (build.stdout + build.stderr).splitlines()[-40:]))
        binary = subprocess.run(["swift", "build", "--show-bin-path"], cwd=app, capture_output=True, text=True).stdout.strip()
        for snippet_name, name in runs:
            temporary = os.path.join(scratch, snippet_name) + "/"
            os.makedirs(temporary)
            ran = subprocess.run([os.path.join(binary, name)], cwd=app, capture_output=True, text=True, timeout=300,
                                 env={**os.environ, "TMPDIR": temporary})
            if ran.returncode != 0:
                sys.exit(f"snippet {snippet_name} failed when run (exit {ran.returncode}):\n{ran.stdout}{ran.stderr[-4000:]}")
        checkouts = os.path.join(app, ".build", "checkouts")
        fetched = sorted(os.listdir(checkouts)) if os.path.isdir(checkouts) else []
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(checkouts) for n in names if not os.path.islink(os.path.join(d, n)))
        print(f"{len(snippets)} snippets compiled as written, {len(runs)} run; packages fetched: {', '.join(fetched)}")
        print(f"figure: client.fresh_app value={len(fetched)} packages limit=8 ratio={8 / max(1, len(fetched)):.2f} "
              f"first_build_s={seconds:.0f} checkout_mb={size / 1e6:.0f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
