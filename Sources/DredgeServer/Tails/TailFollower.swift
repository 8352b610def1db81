import DredgeAdminAPI
import DredgeDomain
import Foundation
import NIOPosix

/// What one watcher of a live tail is shown (#53), read from what the server stored: each
/// device's `records.jsonl` up to the bytes the registry says are held, wherever the device is
/// connected (the nodes of a cluster share the data directory), from when the watcher began.
/// So a record is shown once it is stored, once, in each device's order; a device that moves
/// to another node goes on where it was; a watcher never holds up a device or another watcher.
///
/// A watcher that falls more than ``maxBehind`` bytes behind a device skips to its newest
/// records and is told how many it missed (they are kept all the same). Each call reads at most
/// ``readBytes`` of a device's records.
struct TailFollower {
    static let maxBehind: Int64 = 8 << 20
    static let readBytes = 1 << 20

    let tailID: String
    let paths: DataDirectory
    /// Bytes of each device's records shown (or skipped) so far.
    private(set) var shown: [String: Int64] = [:]
    private var dropped: [String: Int64] = [:]
    private var statuses: [String: TailPartStatus] = [:]
    /// Each device's context numbers' apps, and hosts by agent.
    private var apps: [String: [Int64: String]] = [:]
    private var hosts: [String: String] = [:]

    /// Starts at what `tail` holds now: a watcher sees what is logged from now on.
    init(_ tail: TailRecord, paths: DataDirectory) {
        tailID = tail.id
        self.paths = paths
        for part in tail.parts {
            shown[part.agentID] = part.bytes
            dropped[part.agentID] = part.dropped
            // Told already: the stream's first line.
            statuses[part.agentID] = part.status
        }
    }

    /// Goes on from where a watcher that reconnects stood (`positions`: bytes of each device's
    /// records shown, as ``shown`` said), so it misses and repeats nothing. A position is taken
    /// only where a record ends, within what is held and at most ``maxBehind`` before its end;
    /// any other (or a device not named) starts at what is held now, as a new watcher does.
    mutating func resume(_ positions: [String: Int64], tail: TailRecord) throws {
        for part in tail.parts {
            // Not more than ``maxBehind`` back: what a watcher that far behind would skip.
            guard let at = positions[part.agentID], at >= 0, at < part.bytes, part.bytes - at <= Self.maxBehind else { continue }
            if at > 0 {
                let file = try paths.tailFiles(tailID, agent: part.agentID) + "/" + TailFiles.records
                guard let handle = FileHandle(forReadingAtPath: file) else { continue }
                defer { try? handle.close() }  // read only: nothing to lose
                try handle.seek(toOffset: UInt64(at - 1))
                guard try handle.read(upToCount: 1) == Data([0x0A]) else { continue }
            }
            shown[part.agentID] = at
            // What it left out meanwhile is not counted again: told as it comes from now on.
        }
    }

    /// A device's host, for the events (from the registry, once).
    mutating func name(_ agentID: String, host: String) { hosts[agentID] = host }
    func hasName(_ agentID: String) -> Bool { hosts[agentID] != nil }

    /// The events since the last call, by the registry's `tail` now: the devices when one
    /// joined or changed, what each left out, then its new records. `more`: a device has more
    /// to read than one call reads (call again at once).
    mutating func events(_ tail: TailRecord) throws -> (events: [TailEvent], more: Bool) {
        var events: [TailEvent] = []
        var more = false
        if tail.parts.contains(where: { statuses[$0.agentID] != $0.status }) {
            for part in tail.parts { statuses[part.agentID] = part.status }
            events.append(TailEvent(kind: .devices, devices: tail.parts))
        }
        for part in tail.parts.sorted(by: { $0.agentID < $1.agentID }) {
            let agent = part.agentID
            if part.dropped > dropped[agent, default: 0] {
                events.append(TailEvent(kind: .dropped, agent: agent, host: hosts[agent], count: part.dropped - dropped[agent, default: 0]))
                dropped[agent] = part.dropped
            }
            var from = shown[agent, default: 0]
            guard part.bytes > from else { continue }
            let file = try paths.tailFiles(tailID, agent: agent) + "/" + TailFiles.records
            if part.bytes - from > Self.maxBehind {
                // Too far behind: on from near the newest, the lines between counted as missed.
                let (skipped, to) = try Self.skip(file, from: from, to: part.bytes - Self.maxBehind / 2)
                if skipped > 0 { events.append(TailEvent(kind: .missed, agent: agent, host: hosts[agent], count: skipped)) }
                from = to
            }
            let (lines, end) = try Self.read(file, from: from, upTo: min(part.bytes, from + Int64(Self.readBytes)))
            guard end > from else {
                // The file is gone or shorter than what is held (removed meanwhile): nothing more of it.
                shown[agent] = part.bytes
                continue
            }
            shown[agent] = end
            if end < part.bytes { more = true }
            guard !lines.isEmpty else { continue }
            let decoder = JSONDecoder()
            for line in lines {
                // Checked when it was taken (TailBatchReader): a JSON object. A record the
                // indexer's scanner reads is handed on as its text, only its context read (for
                // the app); any other is decoded, as it is shown all the same.
                let bytes = Array(line)
                let context: Int64?, record: JSONValue?
                if let parsed = bytes.withUnsafeBufferPointer({ RecordLine.parse($0) }) {
                    (context, record) = (parsed.context, nil)
                } else {
                    guard case .object(let members) = try decoder.decode(JSONValue.self, from: Data(line)) else { continue }
                    if case .integer(let number)? = members["context"] { context = number } else { context = nil }
                    record = .object(members)
                }
                var app: String?
                if let context {
                    if apps[agent]?[context] == nil { try loadApps(agent) }
                    app = apps[agent]?[context]
                }
                events.append(TailEvent(kind: .record, agent: agent, host: hosts[agent], app: app, record: record, line: record == nil ? bytes : nil))
            }
        }
        return (events, more)
    }

    /// The apps of a device's contexts, from its contexts file.
    private mutating func loadApps(_ agent: String) throws {
        var named: [Int64: String] = [:]
        for (number, context) in try TailFiles.contexts(in: paths.tailFiles(tailID, agent: agent)) {
            if let n = Int64(number) { named[n] = context.app }
        }
        apps[agent] = named
    }

    /// The whole lines of `file` between `from` and `upTo` (a held length ends a line), and
    /// where the last one ends.
    static func read(_ file: String, from: Int64, upTo: Int64) throws -> (lines: [ArraySlice<UInt8>], end: Int64) {
        guard upTo > from, let handle = FileHandle(forReadingAtPath: file) else { return ([], from) }
        defer { try? handle.close() }  // read only: nothing to lose
        try handle.seek(toOffset: UInt64(from))
        let bytes = [UInt8](try handle.read(upToCount: Int(upTo - from)) ?? Data())
        guard let last = bytes.lastIndex(of: 0x0A) else { return ([], from) }
        let whole = bytes[...last]
        return (whole.split(separator: 0x0A), from + Int64(last) + 1)
    }

    /// Counts the lines from `from` up to the line break at or after `to`; returns them and
    /// where the next line begins.
    static func skip(_ file: String, from: Int64, to: Int64) throws -> (lines: Int64, next: Int64) {
        guard let handle = FileHandle(forReadingAtPath: file) else { return (0, from) }
        defer { try? handle.close() }  // read only: nothing to lose
        try handle.seek(toOffset: UInt64(from))
        var position = from, lines: Int64 = 0
        while true {
            guard let data = try handle.read(upToCount: 1 << 20), !data.isEmpty else { return (lines, position) }
            for (i, byte) in data.enumerated() where byte == 0x0A {
                lines += 1
                if position + Int64(i) >= to { return (lines, position + Int64(i) + 1) }
            }
            position += Int64(data.count)
        }
    }
}
