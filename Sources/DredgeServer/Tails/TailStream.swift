import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// The server's side of one agent's part in a live tail (Protocol § 20): what it holds (the
/// last batch's number and store cursor), and what each batch the agent sends does to it. A
/// batch is taken only in order, under the tail's key for this agent and tail, of the tail's
/// user, while the tail is open; anything else ends the agent's part of the tail. Nothing is
/// kept here: the caller stores what is taken, durably, then calls ``stored(_:)`` for the
/// acknowledgement, one batch at a time (the next ``receive(_:now:)`` comes after it: a
/// connection's frames are handled in order).
struct TailStream: Sendable {
    let tailID: String
    let agentID: String
    let uid: String
    let expiresAt: Timestamp
    private let cipher: TailCipher
    /// The last batch held (0 and 0: none).
    private(set) var held: (seq: UInt64, cursor: UInt64)
    /// Why it ended, once it has.
    private(set) var ended: String?

    enum Outcome: Equatable {
        /// In order and sound: store it, then acknowledge it (``stored(_:)``).
        case take(Taken)
        /// Already held: acknowledged again, nothing stored.
        case again(WireFrame)
        /// The agent's part of the tail ends: tell it (the frame is a `TailStop`).
        case end(reason: String, WireFrame)
    }

    struct Taken: Equatable {
        var seq: UInt64
        var cursor: UInt64
        var dropped: UInt64
        var batch: TailBatchReader.Batch
    }

    /// `started`: the start cursor is kept already (in `held`, when nothing is held); by
    /// default, when `held` is not (0, 0).
    init(
        tailID: String, agentID: String, uid: String, key: SymmetricKey, expiresAt: Timestamp, held: (seq: UInt64, cursor: UInt64) = (0, 0), started: Bool? = nil
    ) throws {
        self.tailID = tailID
        self.agentID = agentID
        self.uid = uid
        self.expiresAt = expiresAt
        self.held = held
        self.started = started ?? (held.seq > 0 || held.cursor > 0)
        cipher = try TailCipher(key: key, tailID: tailID, agentID: agentID)
    }

    /// Whether the start cursor is kept (from the first `TailAccepted`).
    private(set) var started: Bool

    /// `TailAccepted`: the first one's start cursor is kept; each is answered with what the
    /// server holds (seq 0 and that cursor for nothing), for the agent to go on after.
    mutating func accepted(startCursor: UInt64) -> WireFrame {
        if let ended { return stop(ended) }
        if !started && held.seq == 0 {
            held.cursor = startCursor
            started = true
        }
        return acknowledgement
    }

    /// What the server holds, as a `TailAck`.
    var acknowledgement: WireFrame {
        .with { $0.tailAck = .with { $0.tailID = tailID; $0.seq = held.seq; $0.cursor = held.cursor } }
    }

    func stop(_ reason: String) -> WireFrame { Self.stopFrame(tailID, reason) }

    /// A `TailStop` of `tailID`.
    static func stopFrame(_ tailID: String, _ reason: String) -> WireFrame {
        .with { $0.tailStop = .with { $0.tailID = tailID; $0.reason = reason } }
    }

    /// What `batch` does (its `tail_id` is this stream's).
    mutating func receive(_ batch: WireTailBatch, now: Timestamp) -> Outcome {
        if let ended { return .end(reason: ended, stop(ended)) }
        if now.microseconds > expiresAt.microseconds + Int64(WireLimits.tailExpiryGrace.components.seconds) * 1_000_000 {
            return end("the tail has expired")
        }
        if batch.seq >= 1 && batch.seq <= held.seq { return .again(acknowledgement) }
        guard batch.seq == held.seq + 1 else { return end("batch \(batch.seq) came after \(held.seq): a batch is missing") }
        guard started else { return end("batch \(batch.seq) came before the tail was accepted") }
        guard batch.cursor > held.cursor else { return end("batch \(batch.seq)'s cursor is not past the last one's") }
        guard batch.dropped <= WireLimits.maxTailBatchDropped else { return end("batch \(batch.seq) counts more left-out records than a batch may") }
        let plaintext: Data
        do {
            plaintext = try cipher.open(batch.ciphertext, nonce: batch.nonce, seq: batch.seq, dropped: batch.dropped, cursor: batch.cursor)
        } catch {
            return end("batch \(batch.seq) does not authenticate")
        }
        let read: TailBatchReader.Batch
        do {
            read = try TailBatchReader.read(Array(plaintext), uid: uid)
        } catch {
            return end("batch \(batch.seq): \(error.description)")
        }
        guard !read.records.isEmpty || batch.dropped > 0 else { return end("batch \(batch.seq) holds no record and counts no drop") }
        return .take(Taken(seq: batch.seq, cursor: batch.cursor, dropped: batch.dropped, batch: read))
    }

    /// `taken` is stored: it is held now, and acknowledged.
    mutating func stored(_ taken: Taken) -> WireFrame {
        if taken.seq == held.seq + 1 { held = (taken.seq, taken.cursor) }
        return acknowledgement
    }

    private mutating func end(_ reason: String) -> Outcome {
        ended = reason
        return .end(reason: reason, stop(reason))
    }
}
