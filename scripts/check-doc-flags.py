#!/usr/bin/env python3
"""Docs and help agree: every command line the README and docs/ show (`dredge …`,
`dredge-agent …`, `dredge-server …`, `dredge-demo …`) names a command that exists, and every
`--flag` it gives is one that command's `--help` lists. Exits 1 and names each mismatch.

Usage: check-doc-flags.py BIN_DIR"""
import glob, os, re, subprocess, sys

BINARIES = ["dredge-server", "dredge-agent", "dredge-demo", "dredge-bench", "dredge"]
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bin_dir = sys.argv[1]
help_cache = {}


def help_of(path):
    """(subcommands, flags) of a command path, from its --help."""
    key = tuple(path)
    if key not in help_cache:
        out = subprocess.run([os.path.join(bin_dir, path[0])] + path[1:] + ["--help"], capture_output=True, text=True)
        text = out.stdout + out.stderr
        subs, section, default = set(), None, None
        for line in text.splitlines():
            if re.match(r'^[A-Z][A-Z ]+:', line):
                section = line.split(":")[0]
                continue
            if section == "SUBCOMMANDS":
                m = re.match(r'^  ([a-z][a-z0-9-]*)( \(default\))?', line)
                if m:
                    subs.add(m.group(1))
                    if m.group(2):
                        default = m.group(1)
        flags = set(re.findall(r'--[a-z0-9][a-z0-9-]*', text)) | {"--help", "--version"}
        # A command with a default subcommand (`dredge agents` is `dredge agents list`) takes its flags.
        if default:
            flags |= help_of(path + [default])[1]
        help_cache[key] = (subs, flags)
    return help_cache[key]


def distance(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a):
        diagonal, row[0] = row[0], i + 1
        for j, y in enumerate(b):
            diagonal, row[j + 1] = row[j + 1], min(row[j + 1] + 1, row[j] + 1, diagonal + (x != y))
    return row[len(b)]


def snippets(text):
    """Code spans and the lines of fenced blocks."""
    fenced = re.findall(r'```[a-z]*\n(.*?)```', text, re.S)
    rest = re.sub(r'```[a-z]*\n.*?```', '', text, flags=re.S)
    return [line for block in fenced for line in block.splitlines()] + re.findall(r'`([^`\n]+)`', rest)


problems = set()
files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
for file in files:
    with open(file, encoding="utf-8") as f:
        text = f.read()
    for snippet in snippets(text):
        tokens = re.split(r'\s+', snippet.replace("[", " ").replace("]", " ").replace("(", " ").replace(")", " "))
        for i, token in enumerate(tokens):
            if token not in BINARIES:
                continue
            path = [token]
            for word in tokens[i + 1:]:
                if word in ("|", "&&", ";", "||") or word.startswith(("$", ">", "<")) or word in BINARIES:
                    break
                if word.startswith("--"):
                    flag = re.match(r'--[a-z0-9][a-z0-9-]*', word)
                    if flag and flag.group(0) not in help_of(path)[1]:
                        problems.add(f"{os.path.relpath(file, root)}: `{' '.join(path)}` has no {flag.group(0)}")
                    continue
                subs = help_of(path)[0]
                # `pulls|agents`: alternatives, each a command.
                alternatives = [w for w in word.split("|") if w]
                if alternatives and all(w in subs for w in alternatives):
                    for w in alternatives[1:]:
                        help_of(path + [w])
                    path.append(alternatives[0])
                    continue
                # A word that is no command but nearly one is a typo; anything else is prose or
                # an argument, and ends the command.
                if subs and re.fullmatch(r'[a-z][a-z-]+', word) and any(distance(word, s) <= 2 for s in subs):
                    problems.add(f"{os.path.relpath(file, root)}: `{token} … {word}`: no command {word} (did the docs mean one of {', '.join(sorted(subs))}?)")
                break
for p in sorted(problems):
    print(p)
sys.exit(1 if problems else 0)
