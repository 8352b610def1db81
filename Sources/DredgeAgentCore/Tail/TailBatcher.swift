import DredgeDomain
import DredgeStore
import DredgeWire

/// A live tail's records, made into batches (Protocol/README.md § 20): each record the tail
/// reads is offered; within the tail's rates it waits in the next batch, over them it is left
/// out and counted (`dropped`); a batch is taken when it holds ``maxRecords`` records or about
/// ``softBytes`` bytes, or its first record (or first drop) has waited ``maxDelay``, so one record
/// logged alone goes at once. The rates are token buckets holding a second's worth, refilled by
/// the records' own times (never backwards): records logged within the rates while the agent
/// was away all go when it is back; a burst faster than the rates is cut.
///
/// A value with an injected clock (seconds, any monotonic origin) for when batches are due:
/// the same offers at the same times make the same batches.
public struct TailBatcher: Sendable {
    public struct Batch: Sendable, Equatable {
        public var seq: UInt64
        public var dropped: UInt64
        public var cursor: UInt64
        /// `{"contexts":{…},"records":[…]}`, UTF-8.
        public var plaintext: [UInt8]
        public var records: Int
    }

    /// The Swift agent's batching (§ 20 leaves it to the agent).
    public static let maxRecords = 200
    /// Seconds a batch's first record waits for others (25 ms: a tail's latency, measured by
    /// `dredge-bench tail`, against more frames: up to 40 a second per tail for a trickle).
    public static let maxDelay = 0.025
    /// Plaintext bytes a batch is due at.
    public static let softBytes = 192 * 1024
    /// Plaintext bytes a batch never passes (MAX_TAIL_BATCH_BYTES less the tag): a record that
    /// would take it over waits for the next batch.
    public static let maxPlaintextBytes = WireLimits.maxTailBatchBytes - WireLimits.tagBytes
    /// A record line longer than this, or one whose context's JSON is longer than
    /// ``maxContextBytes``, is left out (counted): with its context it must fit one batch.
    public static let maxLineBytes = 128 * 1024
    public static let maxContextBytes = 64 * 1024

    public let recordsPerSecond: Double
    public let bytesPerSecond: Double
    /// The next batch's number.
    public private(set) var nextSeq: UInt64
    /// Where in the store the tail has read to (the last record offered).
    public private(set) var cursor: UInt64
    private var recordTokens: Double
    private var byteTokens: Double
    /// The record time (seconds) the buckets were last refilled at.
    private var refilled: Double?
    /// What waits, in store order: a record's line, or a run of records left out.
    private enum Entry: Sendable {
        case line(id: UInt64, bytes: [UInt8], context: Int64)
        case dropped(lastID: UInt64, count: UInt64)
    }
    private var waiting: [Entry] = []
    private var waitingLines = 0
    private var waitingBytes = 0
    private var since: Double?
    private var contextJSON: [Int64: String] = [:]

    /// `after`: the last batch the server holds (0 for none); `cursor`: where to read on from.
    public init(recordsPerSecond: UInt32, bytesPerSecond: UInt64, after seq: UInt64 = 0, cursor: UInt64, now: Double) {
        self.recordsPerSecond = Double(recordsPerSecond)
        self.bytesPerSecond = Double(bytesPerSecond)
        nextSeq = seq + 1
        self.cursor = cursor
        recordTokens = Double(recordsPerSecond)
        byteTokens = Double(bytesPerSecond)
    }

    /// Goes on after what the server holds (its `TailAck` after `TailAccepted`): numbering from
    /// `seq` + 1, reading after `cursor`. What was waiting, and the drops counted for it, are
    /// read again from the store.
    public mutating func resume(after seq: UInt64, cursor: UInt64) {
        nextSeq = seq + 1
        self.cursor = cursor
        waiting = []
        waitingLines = 0
        waitingBytes = 0
        since = nil
    }

    /// Whether anything waits to be sent (records or a count of drops).
    public var isEmpty: Bool { waiting.isEmpty }

    /// Offers the next record the tail read (`context`: its context's canonical JSON).
    public mutating func offer(_ record: LogRecord, context: String, now: Double) {
        refill(Double(record.timestamp.microseconds) / 1_000_000)
        let id = UInt64(max(0, record.id))
        cursor = id
        if since == nil { since = now }
        var w = JSONWriter()
        record.writeJSON(into: &w)
        let line = Array(w.string.utf8)
        guard line.count <= Self.maxLineBytes, context.utf8.count <= Self.maxContextBytes, recordTokens >= 1, byteTokens >= Double(line.count) else {
            if case .dropped(_, let count)? = waiting.last {
                waiting[waiting.count - 1] = .dropped(lastID: id, count: count + 1)
            } else {
                waiting.append(.dropped(lastID: id, count: 1))
            }
            return
        }
        recordTokens -= 1
        byteTokens -= Double(line.count)
        waiting.append(.line(id: id, bytes: line, context: record.context.rawValue))
        waitingLines += 1
        waitingBytes += line.count + 1
        contextJSON[record.context.rawValue] = context
    }

    /// Whether a batch should be taken now (full, or its first record has waited long enough).
    public func isDue(now: Double) -> Bool {
        guard !isEmpty else { return false }
        return waitingLines >= Self.maxRecords || waitingBytes >= Self.softBytes || (dueIn(now: now) ?? 1) <= 0
    }

    /// How long until the waiting batch is due (nil: nothing waits).
    public func dueIn(now: Double) -> Double? {
        guard !isEmpty else { return nil }
        // A nanosecond's slack: 10.1 − 10.0 is a hair under 0.1 in binary.
        return max(0, Self.maxDelay - (now - (since ?? now)) - 1e-9)
    }

    /// The next batch when one is due (`force`: whatever waits, now): at most ``maxRecords``
    /// records and about ``softBytes`` bytes, with the drops among and just after them; its
    /// cursor is its last entry's, so what it leaves waiting is read again after a resumption.
    public mutating func take(now: Double, force: Bool = false) -> Batch? {
        guard !isEmpty, force || isDue(now: now) else { return nil }
        var lines: [[UInt8]] = []
        var contexts = Set<Int64>()
        // The envelope `{"contexts":{},"records":[]}`; then each line and its comma, each new
        // context with its name, quotes, colon and comma.
        var bytes = 30
        var dropped: UInt64 = 0
        var cursor: UInt64 = 0
        var taken = 0
        for entry in waiting {
            if case .line(_, let line, let context) = entry {
                let added = line.count + 1 + (contexts.contains(context) ? 0 : (contextJSON[context]?.utf8.count ?? 2) + 24)
                if lines.count >= Self.maxRecords || !lines.isEmpty && bytes + added > Self.maxPlaintextBytes { break }
            }
            switch entry {
            case .line(let id, let line, let context):
                if !contexts.contains(context) { bytes += (contextJSON[context]?.utf8.count ?? 2) + 24 }
                lines.append(line)
                contexts.insert(context)
                bytes += line.count + 1
                cursor = id
            case .dropped(let lastID, let count):
                dropped += count
                cursor = lastID
            }
            taken += 1
        }
        waiting.removeFirst(taken)
        waitingLines -= lines.count
        waitingBytes = waiting.reduce(0) { if case .line(_, let line, _) = $1 { $0 + line.count + 1 } else { $0 } }
        since = waiting.isEmpty ? nil : now
        var out: [UInt8] = Array(#"{"contexts":{"#.utf8)
        for (i, id) in contexts.sorted().enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += Array("\"\(id)\":".utf8) + Array((contextJSON[id] ?? "{}").utf8)
        }
        out += Array(#"},"records":["#.utf8)
        for (i, line) in lines.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += line
        }
        out += Array("]}".utf8)
        let batch = Batch(seq: nextSeq, dropped: dropped, cursor: cursor, plaintext: out, records: lines.count)
        nextSeq += 1
        return batch
    }

    private mutating func refill(_ time: Double) {
        guard let last = refilled else {
            refilled = time
            return
        }
        let elapsed = max(0, time - last)
        refilled = max(last, time)
        recordTokens = min(recordsPerSecond, recordTokens + elapsed * recordsPerSecond)
        byteTokens = min(bytesPerSecond, byteTokens + elapsed * bytesPerSecond)
    }
}
