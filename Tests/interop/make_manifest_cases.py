#!/usr/bin/env python3
"""Writes Protocol/vectors/manifests.json: manifests that are valid and invalid under
Protocol/manifest.schema.json, one rule each. The Swift tests and check_vectors.py (with the
`jsonschema` package) must both reach each case's verdict.

Usage: make_manifest_cases.py PROTOCOL_DIR
"""
import copy
import json
import sys

root = sys.argv[1]
with open(f"{root}/vectors/upload.json") as f:
    pull = json.loads(json.load(f)["manifest"])

T = "2026-11-21T08:00:00.000000Z"
ID = "5e0c1d2f3a4b5c6d7e8f90a1b2c3d4e5"
feedback = dict(copy.deepcopy(pull), kind="feedback", upload_id=ID,
                filter={"since": "2026-11-18T08:00:00.000000Z", "until": "2026-11-21T08:00:01.000000Z", "uid": "u-1002"},
                feedback={"feedback_id": ID, "uid": "u-1002", "text": "The oven beeps twice and stops.", "created_at": T})
del feedback["command_id"]
empty = dict(copy.deepcopy(pull), empty=True, record_count=0, days=[])
export = dict(copy.deepcopy(pull), kind="export", agent_id="")
del export["command_id"]

cases = []


ACCEPTED = "accepted"
SCHEMA = "refused: the schema (ERROR_PAYLOAD_INVALID)"
# A receiver's verdict on the wire (§13), for a manifest whose upload (header, ids, the command's
# filter, day files) agrees with it: only the rules beyond the schema can refuse a valid one.
WIRE = {
    "export-unenrolled": "refused: kind export is only in manual export files (§19); an upload's manifest is a pull's or a feedback's (ERROR_PAYLOAD_INVALID)",
    "agent-id-empty-in-pull": "refused: agent_id is the uploading agent's (§13; ERROR_PAYLOAD_INVALID)",
}


def case(name, manifest, valid, rule):
    cases.append({"name": name, "valid": valid, "wire": WIRE.get(name, ACCEPTED) if valid else SCHEMA, "rule": rule,
                  "manifest": json.dumps(manifest, ensure_ascii=False, sort_keys=True)})


def raw(name, text, rule):
    cases.append({"name": name, "valid": False, "wire": SCHEMA, "rule": rule, "manifest": text})


def changed(base, path, value, delete=False):
    m = copy.deepcopy(base)
    target = m
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return m


case("pull", pull, True, "a pull's manifest")
case("pull-empty", empty, True, "an empty selection: no days, record_count 0")
case("feedback", feedback, True, "a feedback's manifest")
case("export-unenrolled", export, True, "a manual export by an agent that is not enrolled: agent_id empty")
case("unknown-top-level-field", dict(copy.deepcopy(pull), future={"x": 1}), True, "fields the schema does not name are ignored")
case("full-filter", changed(pull, ["filter"], {"since": "2026-11-20T00:00:00.000000Z", "until": "2026-11-22T00:00:00.000000Z", "uid": "u-1002",
                                                "types": ["network", "app.checkout"], "levels": ["error", "critical"], "text": "timeout é"}),
     True, "every filter field")
case("unknown-loss-reason", changed(pull, ["losses"], [{"reason": "disk.evicted", "count": 3, "first": T, "last": T, "recorded_at": T}]), True,
     "a loss reason a reader does not know is shown as it is")
case("context-extra", changed(pull, ["contexts", "1", "extra"], {"build": "4411", "region": "eu"}), True, "context extra is strings")

for key in ["format", "upload_id", "kind", "agent_id", "created_at", "filter", "record_count", "empty", "days", "contexts", "losses"]:
    case(f"missing-{key}", changed(pull, [key], None, delete=True), False, f"{key} is required, even when empty")
case("format-2", changed(pull, ["format"], "dredge-export/2"), False, "format is dredge-export/1")
case("upload-id-upper", changed(pull, ["upload_id"], pull["upload_id"].upper()), False, "ids are lowercase hex")
case("upload-id-short", changed(pull, ["upload_id"], pull["upload_id"][:31]), False, "ids are 32 hex digits")
case("upload-id-newline", changed(pull, ["upload_id"], pull["upload_id"] + "\n"), False, "nothing after the id, not even a line break")
case("kind-capital", changed(pull, ["kind"], "Pull"), False, "kind is pull, feedback or export")
case("pull-without-command", changed(pull, ["command_id"], None, delete=True), False, "a pull names its command")
case("pull-with-feedback", dict(copy.deepcopy(pull), feedback=feedback["feedback"]), False, "only feedback has feedback")
case("feedback-without-feedback", changed(feedback, ["feedback"], None, delete=True), False, "a feedback manifest carries the feedback")
case("feedback-with-command", dict(copy.deepcopy(feedback), command_id=ID), False, "a feedback has no command")
case("agent-id-empty-in-pull", changed(pull, ["agent_id"], ""), True, "the schema allows an empty agent_id (manual exports); a server compares it with the upload's")
case("created-at-no-fraction", changed(pull, ["created_at"], "2026-11-21T08:00:00Z"), False, "six fractional digits")
case("created-at-millis", changed(pull, ["created_at"], "2026-11-21T08:00:00.000Z"), False, "six fractional digits")
case("created-at-offset", changed(pull, ["created_at"], "2026-11-21T08:00:00.000000+00:00"), False, "UTC, written Z")
case("created-at-hour-24", changed(pull, ["created_at"], "2026-11-21T24:00:00.000000Z"), False, "hours 00 to 23")
case("record-count-negative", changed(empty, ["record_count"], -1), False, "record_count is at least 0")
case("record-count-string", changed(pull, ["record_count"], "3"), False, "record_count is an integer")
case("record-count-fraction", changed(pull, ["record_count"], 3.5), False, "record_count is an integer")
case("empty-string", changed(pull, ["empty"], "false"), False, "empty is a boolean")
case("empty-number", changed(pull, ["empty"], 0), False, "empty is a boolean")
case("empty-with-days", changed(pull, ["empty"], True), False, "an empty manifest has no days and no records")
case("not-empty-without-days", changed(empty, ["empty"], False), False, "a manifest that is not empty has days and records")
case("day-no-records", changed(pull, ["days", 0, "records"], 0), False, "a day file has at least one record")
case("day-bad-name", changed(pull, ["days", 0, "file"], "2026-11-20.json"), False, "day files are YYYY-MM-DD.jsonl")
case("day-path", changed(pull, ["days", 0, "file"], "../2026-11-20.jsonl"), False, "day file names are bare")
case("day-missing-bytes", changed(pull, ["days", 0, "bytes"], None, delete=True), False, "a day says its bytes")
case("day-first-bad", changed(pull, ["days", 0, "first"], "yesterday"), False, "times are RFC 3339")
case("filter-unknown-field", changed(pull, ["filter", "host"], "kitchen"), False, "a filter field the schema does not name would change the selection")
case("filter-level-unknown", changed(pull, ["filter", "levels"], ["fatal"]), False, "levels are named trace to critical")
case("filter-type-capital", changed(pull, ["filter", "types"], ["Network"]), False, "type names are [a-z0-9._-], 1 to 64")
case("filter-type-long", changed(pull, ["filter", "types"], ["a" * 65]), False, "type names are at most 64 bytes")
case("filter-types-repeated", changed(pull, ["filter", "types"], ["app", "app"]), False, "a type is listed once")
case("filter-uid-empty", changed(pull, ["filter", "uid"], ""), False, "a uid has at least one byte")
case("filter-uid-control", changed(pull, ["filter", "uid"], "u-1\u0000002"), False, "a uid has no control character")
case("filter-text-nul", changed(pull, ["filter", "text"], "a\u0000b"), False, "the text has no NUL")
case("context-key-name", changed(pull, ["contexts"], {"one": pull["contexts"]["1"]}), False, "context keys are decimal integers")
case("context-missing-host", changed(pull, ["contexts", "1", "host"], None, delete=True), False, "a context names its host")
case("context-extra-number", changed(pull, ["contexts", "1", "extra"], {"build": 4411}), False, "context extra values are strings")
case("loss-negative", changed(pull, ["losses"], [{"reason": "queue.full", "count": -1, "first": T, "last": T, "recorded_at": T}]), False,
     "a loss count is at least 0")
case("loss-reason-spaces", changed(pull, ["losses"], [{"reason": "Retention Age", "count": 1, "first": T, "last": T, "recorded_at": T}]), False,
     "loss reasons are [a-z][a-z0-9._-]")
case("feedback-uid-empty", changed(feedback, ["feedback", "uid"], ""), False, "a feedback names its user")
case("feedback-text-empty", changed(feedback, ["feedback", "text"], ""), False, "a feedback has text")
case("feedback-id-bad", changed(feedback, ["feedback", "feedback_id"], "x"), False, "feedback ids are ids")
# Captures (§21): the capture member with its kind, and only there.
capture = dict(copy.deepcopy(feedback), kind="capture", filter={"since": "2026-11-21T07:58:00.000000Z", "until": "2026-11-21T08:00:10.000001Z", "uid": "u-1002"},
               capture={"trigger_id": ID, "set_version": 3, "crash": False, "matched_at": T,
                        "match": {"ts": T, "level": "error", "type": "app", "uid": "u-1002", "message": "payment declined", "context": 1}})
del capture["feedback"]
case("capture-without-capture", changed(capture, ["capture"], None, delete=True), False, "a capture's manifest carries its capture")
case("capture-with-command", dict(copy.deepcopy(capture), command_id=ID), False, "a capture has no command")
case("capture-with-feedback", dict(copy.deepcopy(capture), feedback=feedback["feedback"]), False, "a capture has no feedback")
case("pull-with-capture", dict(copy.deepcopy(pull), capture=capture["capture"]), False, "only a capture has a capture")
case("capture-crash-with-match", changed(capture, ["capture", "crash"], True), False, "a crash capture names no matching record")
case("capture-without-match", changed(capture, ["capture", "match"], None, delete=True), False, "a capture that is no crash names the record that fired it")
case("capture-set-version-0", changed(capture, ["capture", "set_version"], 0), False, "a capture names a set version of 1 or more")
case("capture-match-level-bad", changed(capture, ["capture", "match", "level"], "fatal"), False, "the matching record's level is one of the seven")
raw("array", "[]", "a manifest is a JSON object")
raw("not-json", "{\"format\": ", "a manifest is JSON")

with open(f"{root}/vectors/manifests.json", "w") as f:
    json.dump({
        "description": "Manifests checked against manifest.schema.json, one rule each. `valid`: the schema's verdict. `wire`: a receiver's verdict on an upload carrying it whose header, ids, command filter and day files agree with it (\"accepted\", or \"refused: \" and the rule; every refusal is ERROR_PAYLOAD_INVALID). `manifest` is the text of manifest.json.",
        "cases": cases,
    }, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(f"{len(cases)} cases")
