#!/usr/bin/env python3
"""Every import is declared: each module imports only what its target lists in Package.swift
(SwiftPM would otherwise let a module import any module built before it). And the client
modules an app embeds are portable: they import a platform's own module (Glibc, Musl,
FoundationNetworking, Darwin) only inside `#if canImport(…)` of that module, and name one
(`Glibc.close`) only there too. Exits 1 and names each problem. Reads the manifest through
`swift package dump-package`."""
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
# The library an app embeds: it must build on Apple platforms as on Linux.
CLIENT = {"DredgeDomain", "DredgeJSON", "DredgeStore", "DredgeLogging", "DredgeWire", "DredgeEnvelope", "DredgePayload", "DredgeExport", "DredgeAgentCore"}
PLATFORM = {"Glibc", "Musl", "FoundationNetworking", "Darwin"}
CONDITION = re.compile(r'^\s*#(if|elseif)\s+(.*)$')
CAN_IMPORT = re.compile(r'canImport\((\w+)\)')


def unguarded(text):
    """(line number, what) of each platform import or qualified use outside a `#if canImport`
    branch of that module."""
    found, stack = [], []  # stack: the modules each enclosing branch checks for
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        m = CONDITION.match(line)
        if m:
            modules = set(CAN_IMPORT.findall(m.group(2)))
            if m.group(1) == "if":
                stack.append(modules)
            elif stack:
                stack[-1] = modules
            continue
        if stripped.startswith("#else"):
            if stack:
                stack[-1] = set()
            continue
        if stripped.startswith("#endif"):
            if stack:
                stack.pop()
            continue
        if stripped.startswith("//"):
            continue
        guarded = set().union(*stack) if stack else set()
        imported = IMPORT.findall(line)
        for module in imported:
            if module in PLATFORM and module not in guarded:
                found.append((number, f"imports {module} outside #if canImport({module})"))
        for module in PLATFORM:
            if re.search(r'\b' + module + r'\.[a-z_]', line) and module not in guarded and not imported:
                found.append((number, f"calls {module}. outside #if canImport({module})"))
    return found


for target in manifest["targets"]:
    if target["name"] not in CLIENT:
        continue
    path = target.get("path") or os.path.join("Sources", target["name"])
    for folder, _, files in os.walk(os.path.join(root, path)):
        for name in files:
            if name.endswith(".swift"):
                file = os.path.join(folder, name)
                with open(file, encoding="utf-8") as f:
                    for number, what in unguarded(f.read()):
                        problems.append(f"{os.path.relpath(file, root)}:{number}: {what} (a client module must build on every platform)")
for p in sorted(set(problems)):
    print(p)
sys.exit(1 if problems else 0)
