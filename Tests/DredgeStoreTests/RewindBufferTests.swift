import DredgeDomain
import Foundation
import Testing
@testable import DredgeStore

/// The rewind buffer's ring (#54): records read back in order, the oldest going first when it
/// is full, a snapshot's records let go and no more, a file that is not one refused, damage
/// ending the reading instead of inventing records, and the file owner-only.
@Suite struct RewindBufferTests {
    static func record(_ i: Int, _ message: String = "", level: LogLevel = .debug) -> RewindRecord {
        RewindRecord(
            timestamp: Timestamp(microseconds: 1_800_000_000_000_000 + Int64(i)), level: level, type: .network, uid: "u-\(i % 3)",
            message: message.isEmpty ? "debug \(i)" : message, metadataJSON: #"{"i":\#(i)}"#)
    }

    @Test func recordsReadBackInOrderAndTheOldestGoFirst() throws {
        let dir = TempDir()
        let ring = try RewindBuffer.create(at: dir.file("r/ring"), capacity: RewindBuffer.minimumCapacity)
        for i in 0..<10 { #expect(ring.append(Self.record(i))) }
        #expect(ring.records() == (0..<10).map { Self.record($0) })
        // Far more than it holds: it keeps the newest, whole and in order, across its end many times.
        for i in 10..<5_000 { ring.append(Self.record(i, String(repeating: "x", count: i % 300))) }
        let kept = ring.records()
        #expect(kept.count > 100 && kept.count < 1_000)
        #expect(kept.last == Self.record(4_999, String(repeating: "x", count: 4_999 % 300)))
        let numbers = kept.map { Int($0.timestamp.microseconds - 1_800_000_000_000_000) }
        #expect(numbers == Array((5_000 - kept.count)..<5_000), "the newest, none missing between")
        let bytes = kept.reduce(0) { $0 + 8 + $1.encodedSize }
        #expect(bytes <= RewindBuffer.minimumCapacity && bytes > RewindBuffer.minimumCapacity - 8 - 400 - 100)
        // Larger than a quarter of it: not kept, counted.
        #expect(!ring.append(Self.record(1, String(repeating: "y", count: RewindBuffer.minimumCapacity / 4))))
        #expect(ring.tooLarge == 1 && ring.records().last == kept.last)
        try ring.close()
        #expect(!ring.append(Self.record(1)))
    }

    @Test func aSnapshotIsLetGoAndWhatCameAfterItStays() throws {
        let dir = TempDir()
        let ring = try RewindBuffer.create(at: dir.file("ring"), capacity: RewindBuffer.minimumCapacity)
        for i in 0..<5 { ring.append(Self.record(i)) }
        let (taken, end) = ring.snapshot()
        #expect(taken.count == 5)
        ring.append(Self.record(5))
        ring.discard(through: end)
        #expect(ring.records() == [Self.record(5)])
        // An end from before (or from nowhere) lets nothing more go.
        ring.discard(through: 3)
        ring.discard(through: end + 1_000_000)
        #expect(ring.records() == [Self.record(5)])
    }

    @Test func anotherProcessReadsWhatTheRingHeldAndAFileThatIsNotOneIsRefused() throws {
        let dir = TempDir()
        let path = dir.file("rewind/ring")
        let ring = try RewindBuffer.create(at: path, capacity: 128 * 1024)
        for i in 0..<100 { ring.append(Self.record(i)) }
        // Read through a mapping of its own, as the next run reads a dead one's.
        let again = try #require(try RewindBuffer.open(at: path))
        #expect(again.records() == (0..<100).map { Self.record($0) })
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(stat(dir.file("rewind"), &info) == 0 && info.st_mode & 0o777 == 0o700)
        try again.close()
        try ring.close()

        #expect(try RewindBuffer.open(at: dir.file("none")) == nil)
        try Data(repeating: 7, count: 100_000).write(to: URL(fileURLWithPath: dir.file("junk")))
        #expect(throws: RewindBuffer.Failure.self) { try RewindBuffer.open(at: dir.file("junk")) }
        #expect(throws: RewindBuffer.Failure.self) { try RewindBuffer.create(at: dir.file("tiny"), capacity: 1_000) }
    }

    @Test func aDamagedRecordEndsTheReading() throws {
        let dir = TempDir()
        let path = dir.file("ring")
        let ring = try RewindBuffer.create(at: path, capacity: RewindBuffer.minimumCapacity)
        for i in 0..<10 { ring.append(Self.record(i)) }
        try ring.close()
        // One byte of the fourth record's payload changed on disk.
        let handle = try #require(FileHandle(forUpdatingAtPath: path))
        let fourth = 64 + (0..<3).reduce(0) { $0 + 8 + Self.record($1).encodedSize } + 8 + 3
        try handle.seek(toOffset: UInt64(fourth))
        try handle.write(contentsOf: Data([0xFF]))
        try handle.close()
        let damaged = try #require(try RewindBuffer.open(at: path))
        #expect(damaged.records() == (0..<3).map { Self.record($0) })
        try damaged.close()
    }

    /// Whatever the header and the lengths say, reading and writing stay inside the ring and
    /// never trap: a header that does not hold reads as empty, and a ring written to with one
    /// starts again.
    @Test func aHostileHeaderNeitherTrapsNorReadsOutside() throws {
        let dir = TempDir()
        let path = dir.file("ring")
        func setHeader(head: UInt64, tail: UInt64, firstLength: UInt32? = nil) throws {
            let handle = try #require(FileHandle(forUpdatingAtPath: path))
            try handle.seek(toOffset: 24)
            try handle.write(contentsOf: withUnsafeBytes(of: head.littleEndian) { Data($0) } + withUnsafeBytes(of: tail.littleEndian) { Data($0) })
            if let firstLength {
                try handle.seek(toOffset: 64 + head % UInt64(RewindBuffer.minimumCapacity))
                try handle.write(contentsOf: withUnsafeBytes(of: firstLength.littleEndian) { Data($0) })
            }
            try handle.close()
        }
        let ring = try RewindBuffer.create(at: path, capacity: RewindBuffer.minimumCapacity)
        for i in 0..<10 { ring.append(Self.record(i)) }
        // (head, tail, the first record's length, whether the header holds)
        for (head, tail, length, holds) in [
            (UInt64.max, UInt64.max, nil, false), (UInt64.max - 3, UInt64.max, nil, false), (0, UInt64.max, nil, false), (5, 2, nil, false),
            (UInt64.max / 2, UInt64.max / 2 + 30, nil, false), (0, 100, UInt32.max, true), (0, 100, 0, true),
        ] as [(UInt64, UInt64, UInt32?, Bool)] {
            try setHeader(head: head, tail: tail, firstLength: length)
            let reader = try #require(try RewindBuffer.open(at: path))
            #expect(reader.records().isEmpty, "nothing read from \(head)…\(tail)")
            try reader.close()
            // The writer's own mapping sees it too: a header that does not hold starts the ring
            // again; one that holds with a length that does not is written after, and reading
            // stops at that length as before.
            #expect(ring.append(Self.record(99)))
            #expect(ring.records() == (holds ? [] : [Self.record(99)]))
        }
        try ring.close()
        // A file larger than any ring, or another user's, is not read.
        try Data(count: 64 + RewindBuffer.maximumCapacity + 4096).write(to: URL(fileURLWithPath: dir.file("huge")))
        #expect { try RewindBuffer.open(at: dir.file("huge")) } throws: { ($0 as? RewindBuffer.Failure)?.kind == .damaged }
        if geteuid() == 0 {
            let theirs = try RewindBuffer.create(at: dir.file("theirs"), capacity: RewindBuffer.minimumCapacity)
            try theirs.close()
            #expect(chown(dir.file("theirs"), 12_345, 12_345) == 0)
            #expect { try RewindBuffer.open(at: dir.file("theirs")) } throws: { ($0 as? RewindBuffer.Failure)?.kind == .foreign }
            // A directory of another user's is not used, and a loose one of ours is made private.
            try FileManager.default.createDirectory(atPath: dir.file("their-dir"), withIntermediateDirectories: true)
            #expect(chown(dir.file("their-dir"), 12_345, 12_345) == 0)
            #expect { try RewindBuffer.create(at: dir.file("their-dir/r"), capacity: RewindBuffer.minimumCapacity) } throws: {
                ($0 as? RewindBuffer.Failure)?.kind == .foreign
            }
        }
        try FileManager.default.createDirectory(atPath: dir.file("loose"), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o777])
        try RewindBuffer.create(at: dir.file("loose/r"), capacity: RewindBuffer.minimumCapacity).close()
        var info = stat()
        #expect(stat(dir.file("loose"), &info) == 0 && info.st_mode & 0o777 == 0o700)
    }

    @Test func aRecordReadsBackAsItWasWritten() throws {
        let center = LogEntry(
            timestamp: Timestamp(microseconds: 42), level: .trace, type: "checkout", uid: "u-7", message: "naïve ☕︎ \u{0}",
            metadata: ["b": .int(1), "a": .object(["x": .array([.bool(true), .null, .double(1.5)])])], context: ContextID(rawValue: 3))
        let record = RewindRecord(center)
        #expect(record.metadataJSON == #"{"a":{"x":[true,null,1.5]},"b":1}"#)
        var encoder = RewindRecord.Encoder()
        record.encode(into: &encoder)
        #expect(RewindRecord(decoding: encoder.bytes) == record)
        #expect(RewindRecord(decoding: Array(encoder.bytes.dropLast())) == nil)
        #expect(RewindRecord(decoding: encoder.bytes + [0]) == nil)
        let entry = record.entry(context: ContextID(rawValue: 9), rewound: true)
        #expect(entry.metadata["dredge.rewound"] == LogValue.bool(true) && entry.metadata["b"] == LogValue.int(1) && entry.context.rawValue == 9)
    }
}

extension RewindRecord {
    var encodedSize: Int {
        var encoder = Encoder()
        encode(into: &encoder)
        return encoder.bytes.count
    }
}
