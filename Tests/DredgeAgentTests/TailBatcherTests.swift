import DredgeAgentCore
import DredgeDomain
import DredgeStore
import Foundation
import Testing

/// How a live tail's records become batches (Protocol § 20): in order, numbered, within the
/// tail's rates (the rest counted, never sent), soon (a record alone waits at most 100 ms).
@Suite struct TailBatcherTests {
    static let context = #"{"app":"oven-control","appVersion":"2.4.1","host":"kitchen-oven-0042","os":"Linux","process":"ovend"}"#

    /// Record `id`, logged `at` seconds after a fixed time (the rates count by it).
    func record(_ id: Int64, message: String = "m", context: Int64 = 1, at: Double = 0) -> LogRecord {
        LogRecord(
            id: id, timestamp: Timestamp(microseconds: 1_795_340_400_000_000 + Int64(at * 1_000_000) + id), level: .warning, type: .network, uid: "u-1", message: message,
            metadataJSON: #"{"http.status":504}"#, context: ContextID(rawValue: context))
    }

    func taken(_ b: inout TailBatcher, now: Double, force: Bool = false) throws -> TailBatcher.Batch {
        let batch = b.take(now: now, force: force)
        return try #require(batch)
    }

    func decoded(_ batch: TailBatcher.Batch) throws -> (records: [[String: Any]], contexts: [String: Any]) {
        let object = try #require(try JSONSerialization.jsonObject(with: Data(batch.plaintext)) as? [String: Any])
        return (try #require(object["records"] as? [[String: Any]]), try #require(object["contexts"] as? [String: Any]))
    }

    @Test func aRecordAloneGoesWithinTheBatchDelayAsTheStoreWroteIt() throws {
        let delay = TailBatcher.maxDelay
        var b = TailBatcher(recordsPerSecond: 200, bytesPerSecond: 1 << 20, cursor: 41, now: 10)
        #expect(b.take(now: 10) == nil && b.dueIn(now: 10) == nil)
        b.offer(record(42, message: "GET /recipes timeout"), context: Self.context, now: 10)
        #expect(b.take(now: 10 + delay / 2) == nil && (b.dueIn(now: 10 + delay / 2) ?? 0) > delay / 2 - 0.001)
        let batch = try taken(&b, now: 10 + delay)
        #expect(batch.seq == 1 && batch.cursor == 42 && batch.dropped == 0 && batch.records == 1)
        let (records, contexts) = try decoded(batch)
        #expect(records.first?["message"] as? String == "GET /recipes timeout" && records.first?["context"] as? Int == 1)
        #expect((contexts["1"] as? [String: Any])?["app"] as? String == "oven-control")
        // The line is the store's own (§ 13), byte for byte.
        var w = JSONWriter()
        record(42, message: "GET /recipes timeout").writeJSON(into: &w)
        #expect(String(decoding: batch.plaintext, as: UTF8.self).contains(w.string))
        #expect(b.isEmpty && b.nextSeq == 2)
    }

    @Test func aFullBatchGoesAtOnceAndTheRestFollowsNumbered() throws {
        var b = TailBatcher(recordsPerSecond: 10_000, bytesPerSecond: 16 << 20, after: 6, cursor: 0, now: 0)
        for id in 1...250 { b.offer(record(Int64(id), context: Int64(id % 3)), context: Self.context, now: 0) }
        let first = try taken(&b, now: 0)
        #expect(first.seq == 7 && first.records == TailBatcher.maxRecords && first.cursor == 200, "the cursor is the batch's last record's")
        let (records, contexts) = try decoded(first)
        #expect(records.count == 200 && Set(contexts.keys) == ["0", "1", "2"])
        #expect(b.take(now: 0) == nil, "the rest is not full yet")
        let second = try taken(&b, now: 0, force: true)
        #expect(second.seq == 8 && second.records == 50 && second.cursor == 250)
    }

    /// Over a rate, records are left out and counted in the next batch; a second later the
    /// buckets are full again.
    @Test func recordsOverTheRatesAreCountedNotSent() throws {
        var b = TailBatcher(recordsPerSecond: 10, bytesPerSecond: 1 << 20, cursor: 0, now: 0)
        for id in 1...25 { b.offer(record(Int64(id)), context: Self.context, now: 0) }
        let burst = try taken(&b, now: 0.1)
        #expect(burst.records == 10 && burst.dropped == 15 && burst.cursor == 25, "the drops after its last record go with it")
        #expect(try decoded(burst).records.compactMap { $0["ts"] as? String }.count == 10)
        b.offer(record(26, at: 0.5), context: Self.context, now: 0.5)
        let half = try taken(&b, now: 0.6)
        #expect(half.records == 1 && half.dropped == 0, "five tokens back after half a second of the records' time")
        // A backlog logged within the rate (read at once, after a reconnection) goes whole.
        var backlog = TailBatcher(recordsPerSecond: 10, bytesPerSecond: 1 << 20, cursor: 0, now: 0)
        for id in 1...100 { backlog.offer(record(Int64(id), at: Double(id) * 0.1), context: Self.context, now: 20) }
        let caughtUp = try taken(&backlog, now: 20, force: true)
        #expect(caughtUp.records == 100 && caughtUp.dropped == 0)
        // Bytes: a line longer than a second's bytes never goes.
        var bytes = TailBatcher(recordsPerSecond: 100, bytesPerSecond: 1_024, cursor: 0, now: 0)
        bytes.offer(record(1, message: String(repeating: "x", count: 2_000)), context: Self.context, now: 0)
        bytes.offer(record(2), context: Self.context, now: 0)
        let mixed = try taken(&bytes, now: 0.2)
        #expect(mixed.records == 1 && mixed.dropped == 1 && mixed.cursor == 2)
        // Only drops: a batch still says so, soon.
        var starved = TailBatcher(recordsPerSecond: 1, bytesPerSecond: 1_024, cursor: 0, now: 0)
        starved.offer(record(1), context: Self.context, now: 0)
        _ = starved.take(now: 0.1)
        starved.offer(record(2, at: 0.2), context: Self.context, now: 0.2)
        let dropsOnly = try taken(&starved, now: 0.3)
        #expect(dropsOnly.records == 0 && dropsOnly.dropped == 1 && dropsOnly.cursor == 2)
    }

    /// No batch passes MAX_TAIL_BATCH_BYTES with its tag, however large its records: one that
    /// would take it over waits for the next batch.
    @Test func largeRecordsNeverMakeABatchTooLargeToSeal() throws {
        var b = TailBatcher(recordsPerSecond: 10_000, bytesPerSecond: 16 << 20, cursor: 0, now: 0)
        for id in 1...6 { b.offer(record(Int64(id), message: String(repeating: "x", count: 100_000)), context: Self.context, now: 0) }
        var seen = 0
        while let batch = b.take(now: 0, force: true) {
            #expect(batch.plaintext.count + 16 <= 262_144, "\(batch.plaintext.count)")
            #expect(try JSONSerialization.jsonObject(with: Data(batch.plaintext)) is [String: Any])
            seen += batch.records
        }
        #expect(seen == 6)
        // A record too long to travel at all is counted, not sent.
        b.offer(record(7, message: String(repeating: "y", count: 200_000)), context: Self.context, now: 0)
        let dropped = try taken(&b, now: 0, force: true)
        #expect(dropped.records == 0 && dropped.dropped == 1 && dropped.cursor == 7)
    }

    /// After a reconnection or a restart the tail goes on from what the server holds: what was
    /// waiting is read again from the store, so it is dropped here, drops and all.
    @Test func resumingGoesOnFromWhatTheServerHolds() throws {
        var b = TailBatcher(recordsPerSecond: 200, bytesPerSecond: 1 << 20, cursor: 0, now: 0)
        for id in 1...3 { b.offer(record(Int64(id)), context: Self.context, now: 0) }
        _ = try taken(&b, now: 0, force: true)
        b.offer(record(4), context: Self.context, now: 0)
        b.resume(after: 1, cursor: 3)
        #expect(b.isEmpty && b.nextSeq == 2 && b.cursor == 3)
        b.offer(record(4), context: Self.context, now: 1)
        let again = try taken(&b, now: 1, force: true)
        #expect(again.seq == 2 && again.records == 1 && again.cursor == 4)
    }
}
