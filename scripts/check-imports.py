#!/usr/bin/env python3
"""Every import is declared: each module imports only what its target lists in Package.swift
(SwiftPM would otherwise let a module import any module built before it). Exits 1 and names
each undeclared import. Reads the manifest through `swift package dump-package`."""
import json, os, re, subprocess, sys

SYSTEM = {"Foundation", "FoundationEssentials", "FoundationNetworking", "Glibc", "Darwin", "Dispatch",
          "Synchronization", "Testing", "XCTest", "_Concurrency", "Musl"}
IMPORT = re.compile(r'^\s*(?:@\w+\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?([A-Za-z_][A-Za-z0-9_]*)', re.M)

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
manifest = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=root, check=True, capture_output=True, text=True).stdout)
problems = []
for target in manifest["targets"]:
    kind = target["type"]
    if kind in ("system", "binary", "plugin", "macro"):
        continue
    path = target.get("path") or os.path.join("Tests" if kind == "test" else "Sources", target["name"])
    allowed = set(SYSTEM) | {target["name"]}
    for dep in target["dependencies"]:
        for form in ("byName", "target", "product"):
            if form in dep:
                allowed.add(dep[form][0])
    for folder, _, files in os.walk(os.path.join(root, path)):
        for name in files:
            if not name.endswith(".swift"):
                continue
            file = os.path.join(folder, name)
            with open(file, encoding="utf-8") as f:
                for module in IMPORT.findall(f.read()):
                    if module not in allowed:
                        problems.append(f"{os.path.relpath(file, root)}: imports {module}, which target {target['name']} does not declare")
for p in sorted(set(problems)):
    print(p)
sys.exit(1 if problems else 0)
