#!/usr/bin/env python3
"""A new app package that follows the README: every documented snippet, compiled and run.

Reads the `swift` blocks of README.md and docs/logging.md. Each must be marked, on the line
before it, either

    <!-- manifest -->                    the install snippet (Package.swift arguments), or
    <!-- snippet: NAME [run]             code an app writes; the lines up to `-->` are a
    PRELUDE                              prelude that declares what the snippet uses
    -->

(an unmarked block fails: nothing documented goes unchecked). Then, in a new directory, it
writes a SwiftPM package whose manifest is the install snippet (the URL replaced by this
repository's path, under the name `dredge`), and one source file per snippet; builds it with
a fresh `.build`, runs the snippets marked `run`, and prints what an app developer pays:

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


def blocks():
    manifests, snippets = [], []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        marked = set()
        for m in MARKER.finditer(text):
            code_start = m.start(5)
            marked.add(code_start)
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
    return manifests[0][1], snippets


def source(snippet):
    imports, body = [], []
    for line in snippet["code"].splitlines():
        (imports if re.match(r"^import \w+\s*$", line) else body).append(line)
    indent = lambda text: "\n".join(("        " + l) if l.strip() else "" for l in text.splitlines())
    kind = "".join(part.capitalize() for part in snippet["name"].split("-"))
    # As an app writes it: synchronous unless the snippet awaits.
    uncommented = "\n".join(line.split("//")[0] for line in (snippet["code"] + "\n" + snippet["prelude"]).splitlines())
    asynchronous = "await " in uncommented
    text = "\n".join(
        [
            f"// {snippet['doc']}: snippet {snippet['name']}",
            "import DredgeLogging",
            "import Foundation",
            "#if canImport(FoundationNetworking)",
            "import FoundationNetworking",
            "#endif",
            *sorted(set(imports) - {"import DredgeLogging", "import Foundation"}),
            "",
            f"enum Snippet{kind} {{",
            f"    static func run() {'async ' if asynchronous else ''}throws {{",
            indent(snippet["prelude"]),
            indent("\n".join(body)),
            "    }",
            "}",
            "",
        ]
    )
    return text, kind, asynchronous


def main():
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    manifest, snippets = blocks()
    work = keep or tempfile.mkdtemp(prefix="dredge-fresh-app-")
    if keep:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    try:
        os.symlink(ROOT, os.path.join(work, "dredge"))
        url = re.search(r'\.package\(url: "[^"]+", from: "[^"]+"', manifest)
        if not url:
            sys.exit("the install snippet has no .package(url:from:)")
        manifest = manifest.replace(url.group(0), f'.package(path: "{work}/dredge"')
        with open(os.path.join(work, "Package.swift"), "w") as f:
            f.write('// swift-tools-version:6.1\nimport PackageDescription\n\nlet package = Package(\n    name: "OvenControl",\n'
                    '    platforms: [.macOS(.v15)],\n' + manifest + ")\n")
        sources = os.path.join(work, "Sources", "OvenControl")
        os.makedirs(sources)
        runs = []
        for snippet in snippets:
            text, kind, asynchronous = source(snippet)
            with open(os.path.join(sources, f"Snippet{kind}.swift"), "w") as f:
                f.write(text)
            if snippet["run"]:
                runs.append((snippet["name"], kind, asynchronous))
        with open(os.path.join(sources, "main.swift"), "w") as f:
            for name, kind, asynchronous in runs:
                f.write(f'try {"await " if asynchronous else ""}Snippet{kind}.run()\nprint("snippet {name}: ran")\n')
        start = time.monotonic()
        build = subprocess.run(["swift", "build"], cwd=work, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if build.returncode != 0:
            errors = list(dict.fromkeys(l for l in (build.stdout + build.stderr).splitlines() if re.match(r"^/.*error:", l)))
            sys.exit("the documented snippets do not build:\n" + "\n".join(errors[:40] or (build.stdout + build.stderr).splitlines()[-40:]))
        binary = subprocess.run(["swift", "build", "--show-bin-path"], cwd=work, capture_output=True, text=True).stdout.strip()
        ran = subprocess.run([os.path.join(binary, "OvenControl")], cwd=work, capture_output=True, text=True, timeout=300)
        if ran.returncode != 0 or ran.stdout.count(": ran") != len(runs):
            sys.exit(f"the snippets failed when run (exit {ran.returncode}):\n{ran.stdout}{ran.stderr[-4000:]}")
        checkouts = os.path.join(work, ".build", "checkouts")
        fetched = sorted(os.listdir(checkouts)) if os.path.isdir(checkouts) else []
        size = sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(checkouts) for name in names if not os.path.islink(os.path.join(d, name)))
        print(f"{len(snippets)} snippets compiled, {len(runs)} run; packages fetched: {', '.join(fetched)}")
        print(f"figure: client.fresh_app value={len(fetched)} packages limit=8 ratio={8 / max(1, len(fetched)):.2f} "
              f"first_build_s={seconds:.0f} checkout_mb={size / 1e6:.0f}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
