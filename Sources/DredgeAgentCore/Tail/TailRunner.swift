import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeStore
import DredgeWire

/// One live tail on the agent (Protocol/README.md § 20), as a value the agent's loop drives:
/// after `TailAccepted` it waits for the server's `TailAck` (what the server holds), then each
/// ``poll(store:now:)`` reads the tail's user's new records after its cursor, batches them
/// (``TailBatcher``), seals each batch under the tail key and hands back the frames to send,
/// with at most MAX_TAIL_IN_FLIGHT batches unacknowledged. The store is its buffer: nothing
/// is kept that the store does not hold, so a reconnection or a restart goes on from what the
/// server acknowledged, read again from the store.
public struct TailRunner: Sendable {
    public let accepted: TailAdmission.Accepted
    /// Where the tail began: the store's last row id when it was first accepted here (after a
    /// restart, when it was accepted again; the server keeps the first it was told).
    public let startCursor: UInt64
    /// Records read from the store per poll, at most.
    public static let readLimit = 1_000
    private let cipher: TailCipher
    /// Nil while waiting for the server's `TailAck` after `TailAccepted`.
    private var batcher: TailBatcher?
    /// Batches sent and not yet acknowledged: their numbers and cursors.
    private var inFlight: [(seq: UInt64, cursor: UInt64)] = []
    private var contexts: [Int64: String] = [:]

    public init(_ accepted: TailAdmission.Accepted, agentID: String, startCursor: UInt64) throws {
        self.accepted = accepted
        self.startCursor = startCursor
        cipher = try TailCipher(key: accepted.key, tailID: accepted.tailID, agentID: agentID)
    }

    /// Whether it waits for the server's `TailAck` before sending.
    public var isWaitingForServer: Bool { batcher == nil }

    /// The `TailAccepted` to send (again, after a reconnection): nothing is sent after it until
    /// the server says what it holds.
    public mutating func accept() -> WireFrame {
        batcher = nil
        inFlight = []
        return .with { $0.tailAccepted = .with { $0.tailID = accepted.tailID; $0.startCursor = startCursor } }
    }

    /// The server's `TailAck`: after `TailAccepted`, what it holds (seq 0 and the tail's start
    /// cursor for nothing), to go on from; otherwise the batches it has stored. One for a batch
    /// sent with another cursor (an earlier connection's, stored after all) is gone on from
    /// like the first.
    public mutating func acknowledged(_ ack: WireTailAck, now: Double) {
        if var batcher, !inFlight.contains(where: { $0.seq == ack.seq && $0.cursor != ack.cursor }) {
            if ack.seq >= batcher.nextSeq {
                // An acknowledgement of a batch this runner never numbered: go on from it.
                batcher.resume(after: ack.seq, cursor: ack.cursor)
                self.batcher = batcher
                inFlight = []
            } else {
                inFlight.removeAll { $0.seq <= ack.seq }
            }
            return
        }
        batcher = TailBatcher(recordsPerSecond: accepted.recordsPerSecond, bytesPerSecond: accepted.bytesPerSecond, after: ack.seq, cursor: ack.cursor, now: now)
        inFlight = []
    }

    /// Whether the tail is past its expiry by the agent's clock: the agent stops it then,
    /// whether or not it heard a `TailStop` (§ 20).
    public func hasExpired(at now: Timestamp) -> Bool { now >= accepted.expiresAt }

    /// Batches sent and not yet acknowledged.
    public var unacknowledged: Int { inFlight.count }

    /// Whether records (or a count of drops) wait for their batch.
    public var isHolding: Bool { !(batcher?.isEmpty ?? true) }

    /// Reads what is new, and returns the `TailBatch` frames now due (none while waiting for
    /// the server, or with MAX_TAIL_IN_FLIGHT unacknowledged).
    public mutating func poll(store: LogStore, now: Double, clock: Timestamp = .now) throws -> [WireFrame] {
        guard var batcher, !hasExpired(at: clock) else { return [] }
        defer { self.batcher = batcher }
        var frames: [WireFrame] = []
        while inFlight.count < WireLimits.maxTailInFlight {
            if !batcher.isDue(now: now) {
                let records = try store.records(after: Int64(clamping: batcher.cursor), matching: accepted.filter, limit: Self.readLimit)
                let unknown = Set(records.map(\.context.rawValue)).subtracting(contexts.keys)
                if !unknown.isEmpty {
                    for (id, context) in try store.contexts(unknown.map { ContextID(rawValue: $0) }) { contexts[id.rawValue] = context.canonicalJSON }
                }
                for record in records { batcher.offer(record, context: contexts[record.context.rawValue] ?? "{}", now: now) }
            }
            guard let batch = batcher.take(now: now) else { break }
            let (nonce, sealed) = try cipher.seal(batch.plaintext, seq: batch.seq, dropped: batch.dropped, cursor: batch.cursor)
            frames.append(.with {
                $0.tailBatch = .with {
                    $0.tailID = accepted.tailID
                    $0.seq = batch.seq
                    $0.dropped = batch.dropped
                    $0.cursor = batch.cursor
                    $0.nonce = .init(nonce)
                    $0.ciphertext = .init(sealed)
                }
            })
            inFlight.append((batch.seq, batch.cursor))
        }
        return frames
    }

    /// How long until the next poll has something to send, at most `idle` (nil while waiting
    /// for the server).
    public func nextPoll(now: Double, idle: Double = 0.05) -> Double? {
        guard let batcher else { return nil }
        return min(idle, batcher.dueIn(now: now) ?? idle)
    }
}
