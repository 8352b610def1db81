import DredgeAdminAPI
import DredgeDomain
import DredgeTestSupport
import Foundation
import Testing
@testable import DredgeServer

/// What a watcher is shown of the stored records (``TailFollower``): from when it began, up to
/// what is held, each once; a watcher far behind skips to the newest, told how many it missed.
@Suite struct TailFollowerTests {
    let dir = TempDir()
    static let tailID = String(repeating: "5d", count: 16)
    static let agent = String(repeating: "4f", count: 16)

    func tail(bytes: Int64, dropped: Int64 = 0, status: TailPartStatus = .running) -> TailRecord {
        TailRecord(
            id: Self.tailID, uid: "u-1", agents: nil, filter: LogFilter(uid: "u-1"), issuedAt: .now, expiresAt: Timestamp.now.adding(.seconds(600)),
            recordsPerSecond: 100, bytesPerSecond: 1 << 20, verbose: false, verboseTypes: [], requestedBy: "alice", reason: nil, createdAt: Date(), stopped: nil,
            parts: [TailPart(agentID: Self.agent, status: status, records: 0, dropped: dropped, bytes: bytes, updatedAt: Date())])
    }

    static func line(_ message: String) -> String {
        #"{"ts":"2026-11-30T10:00:00.000000Z","level":"warning","type":"app","uid":"u-1","message":"\#(message)","metadata":{},"context":1}"# + "\n"
    }

    func write(_ text: String) throws -> Int64 {
        let paths = DataDirectory(dir.path)
        let directory = try paths.tailFiles(Self.tailID, agent: Self.agent)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let file = directory + "/" + TailFiles.records
        if !FileManager.default.fileExists(atPath: file) { FileManager.default.createFile(atPath: file, contents: nil) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
        defer { try? handle.close() }  // a test's file
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(text.utf8))
        return Int64(try handle.offset())
    }

    func messages(_ events: [TailEvent]) -> [String] {
        events.compactMap { if case .object(let m)? = $0.recordValue, case .string(let s)? = m["message"] { s } else { nil } }
    }

    @Test func aWatcherSeesWhatIsHeldFromWhenItBeganEachOnce() throws {
        let before = try write(Self.line("before"))
        var follower = TailFollower(tail(bytes: before), paths: DataDirectory(dir.path))
        let held = try write(Self.line("a") + Self.line("b"))
        _ = try write(Self.line("not held yet"))
        let first = try follower.events(tail(bytes: held, dropped: 2))
        #expect(messages(first.events) == ["a", "b"] && !first.more)
        #expect(first.events.contains { $0.kind == .dropped && $0.count == 2 })
        #expect(!first.events.contains { $0.kind == .devices }, "the devices as they were are the stream's first line, not repeated")
        #expect(messages(try follower.events(tail(bytes: held, dropped: 2)).events).isEmpty, "nothing twice")
        #expect(try follower.events(tail(bytes: held, dropped: 2, status: .ended)).events.map(\.kind) == [.devices], "a device that ended is told")
    }

    @Test func aWatcherFarBehindSkipsToTheNewestAndIsToldWhatItMissed() throws {
        var follower = TailFollower(tail(bytes: 0), paths: DataDirectory(dir.path))
        var text = ""
        let count = Int(TailFollower.maxBehind) / Self.line("x-000000").utf8.count + 1_000
        for i in 0..<count { text += Self.line("x-" + String(format: "%06d", i)) }
        let held = try write(text)
        var shown: [String] = []
        var missed: Int64 = 0
        var read = try follower.events(tail(bytes: held))
        while true {
            shown += messages(read.events)
            missed += read.events.filter { $0.kind == .missed }.compactMap(\.count).reduce(0, +)
            guard read.more else { break }
            read = try follower.events(tail(bytes: held))
        }
        #expect(missed > 0 && Int64(shown.count) + missed == Int64(count), "every line either shown or counted as missed")
        #expect(shown.last == "x-" + String(format: "%06d", count - 1), "the newest are shown")
        #expect(Set(shown).count == shown.count)
    }
}
