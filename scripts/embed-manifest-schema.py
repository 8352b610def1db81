#!/usr/bin/env python3
"""Copies Protocol/manifest.schema.json into Sources/DredgeReception/ManifestSchema.swift
(the schema's text is compiled into the library; ManifestSchemaTests fails when they differ)."""
import os
import re

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
schema = open(os.path.join(root, "Protocol/manifest.schema.json"), encoding="utf-8").read()
if '"""#' in schema or "\\#(" in schema:
    raise SystemExit("the schema holds a sequence a Swift raw string cannot")
path = os.path.join(root, "Sources/DredgeReception/ManifestSchema.swift")
swift = open(path, encoding="utf-8").read()
start = swift.index('public static let text = #"""\n') + len('public static let text = #"""\n')
end = swift.index('\n"""#', start)
swift = swift[:start] + schema + swift[end:]
open(path, "w", encoding="utf-8").write(swift)
print("ManifestSchema.swift now holds", len(schema), "bytes of schema")
