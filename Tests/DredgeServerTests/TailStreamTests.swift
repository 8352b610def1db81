import Crypto
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import DredgeWire
import Foundation
import Testing

/// The server's side of a live tail (Protocol § 20), one agent's part: batches taken in order,
/// under the tail's key for this tail and agent, of the tail's user, while it is open; a batch
/// held already acknowledged again; anything else ends the agent's part with a `TailStop`.
@Suite struct TailStreamTests {
    static let tail = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"
    static let agent = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
    static let context = #"{"app":"oven-control","appVersion":"2.4.1","host":"kitchen-oven-0042","os":"Linux","process":"ovend"}"#
    let key = SymmetricKey(size: .bits256)
    let now = Timestamp(rfc3339: "2026-11-30T10:00:00Z")!

    static func record(_ n: Int, uid: String = "u-1", context: Int = 1) -> String {
        #"{"ts":"2026-11-30T09:59:\#(String(format: "%02d", n % 60)).250000Z","level":"warning","type":"network","uid":"\#(uid)","message":"timeout \#(n)","metadata":{"http.status":504},"context":\#(context)}"#
    }

    static func plaintext(_ records: [String], contexts: [Int: String] = [1: context]) -> [UInt8] {
        Array(#"{"contexts":{\#(contexts.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ","))},"records":[\#(records.joined(separator: ","))]}"#.utf8)
    }

    /// A stream whose tail the agent accepted, starting at store row 5.
    func stream(expiresIn seconds: Int64 = 900) throws -> TailStream {
        var s = try TailStream(tailID: Self.tail, agentID: Self.agent, uid: "u-1", key: key, expiresAt: now.adding(.seconds(seconds)))
        _ = s.accepted(startCursor: 5)
        return s
    }

    func batch(_ seq: UInt64, _ plaintext: [UInt8], dropped: UInt64 = 0, cursor: UInt64? = nil, agent: String = Self.agent, key: SymmetricKey? = nil) throws -> WireTailBatch {
        let cursor = cursor ?? seq * 10
        let (nonce, sealed) = try TailCipher(key: key ?? self.key, tailID: Self.tail, agentID: agent).seal(plaintext, seq: seq, dropped: dropped, cursor: cursor)
        return .with { $0.tailID = Self.tail; $0.seq = seq; $0.dropped = dropped; $0.cursor = cursor; $0.nonce = Data(nonce); $0.ciphertext = Data(sealed) }
    }

    func taken(_ outcome: TailStream.Outcome) -> TailStream.Taken? { if case .take(let t) = outcome { t } else { nil } }
    func ended(_ outcome: TailStream.Outcome) -> String? { if case .end(let reason, let frame) = outcome, frame.tailStop.reason == reason { reason } else { nil } }

    /// A batch that counts more left-out records than one may (MAX_TAIL_BATCH_DROPPED) ends the
    /// part: summed, such counts once overflowed the registry's column and stopped the server.
    @Test func aBatchCountingTooManyDropsEndsThePart() throws {
        var s = try stream()
        #expect(ended(s.receive(try batch(1, Self.plaintext([]), dropped: WireLimits.maxTailBatchDropped + 1), now: now)) == "batch 1 counts more left-out records than a batch may")
        var t = try stream()
        #expect(taken(t.receive(try batch(1, Self.plaintext([]), dropped: WireLimits.maxTailBatchDropped), now: now))?.dropped == WireLimits.maxTailBatchDropped)
    }

    @Test func batchesAreTakenInOrderAndAcknowledgedOnceStored() throws {
        var fresh = try TailStream(tailID: Self.tail, agentID: Self.agent, uid: "u-1", key: key, expiresAt: now.adding(.seconds(900)))
        #expect(fresh.receive(try batch(1, Self.plaintext([Self.record(1)])), now: now) == .end(reason: "batch 1 came before the tail was accepted", fresh.stop("batch 1 came before the tail was accepted")))
        var s = try stream()
        #expect(s.acknowledgement.tailAck.seq == 0 && s.acknowledgement.tailAck.cursor == 5, "nothing held yet: the start")
        #expect(s.accepted(startCursor: 99).tailAck.cursor == 5, "the first start is kept (an agent that restarted knows only its end)")
        let first = try #require(taken(s.receive(try batch(1, Self.plaintext([Self.record(1), Self.record(2)])), now: now)))
        #expect(first.batch.records.map { String(decoding: $0, as: UTF8.self) } == [Self.record(1), Self.record(2)], "each record as sent")
        #expect(first.batch.contexts[1].map { String(decoding: $0, as: UTF8.self) } == Self.context && first.batch.times.count == 2)
        #expect(s.held.seq == 0, "held only once stored")
        let ack = s.stored(first)
        #expect(ack.tailAck.seq == 1 && ack.tailAck.cursor == 10 && s.held == (1, 10))
        // A batch held already (sent again after a reconnection): acknowledged again, not taken.
        #expect(s.receive(try batch(1, Self.plaintext([Self.record(1)])), now: now) == .again(s.acknowledgement))
        // Drops alone are a batch too.
        let drops = try #require(taken(s.receive(try batch(2, Self.plaintext([]), dropped: 7), now: now)))
        #expect(drops.dropped == 7 && drops.batch.records.isEmpty)
        _ = s.stored(drops)
        #expect(s.held == (2, 20))
    }

    /// What ends the agent's part of a tail, each with its reason, said in a `TailStop`; and
    /// after that every batch of it is answered the same way.
    @Test func aBrokenBatchEndsTheTail() throws {
        let good = Self.plaintext([Self.record(1)])
        let cases: [(String, WireTailBatch, String)] = [
            ("a gap", try batch(2, good), "a batch is missing"),
            ("sealed for another agent", try batch(1, good, agent: "0f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"), "does not authenticate"),
            ("under another key", try batch(1, good, key: SymmetricKey(size: .bits256)), "does not authenticate"),
            ("another user's record", try batch(1, Self.plaintext([Self.record(1), Self.record(2, uid: "u-2")])), "not the tail's user's"),
            ("a context it does not hold", try batch(1, Self.plaintext([Self.record(1, context: 2)])), "does not hold"),
            ("not a record", try batch(1, Self.plaintext([#"{"ts":"yesterday","level":"warning","type":"network","uid":"u-1","context":1}"#])), "not a record"),
            ("not JSON", try batch(1, Array("{\"records\":[".utf8)), "not one JSON object"),
            ("nothing at all", try batch(1, Self.plaintext([])), "no record"),
            ("too many records", try batch(1, Self.plaintext(Array(repeating: Self.record(1), count: WireLimits.maxTailBatchRecords + 1))), "more than"),
            ("records twice", try batch(1, Array(#"{"contexts":{"1":{}},"records":[],"records":[]}"#.utf8)), "twice"),
            ("a context named with a leading zero", try batch(1, Self.plaintext([Self.record(1)], contexts: [1: Self.context]).replacing(Array(#""1":"#.utf8), with: Array(#""01":"#.utf8))), "leading zero"),
            ("at its start cursor", try batch(1, good, cursor: 5), "is not past"),
        ]
        for (what, b, reason) in cases {
            var s = try stream()
            let outcome = s.receive(b, now: now)
            #expect(ended(outcome)?.contains(reason) == true, "\(what): \(outcome)")
            #expect(ended(s.receive(try batch(1, good), now: now)) != nil, "\(what): ended for good")
        }
        // A cursor that goes back.
        var s = try stream()
        _ = s.stored(try #require(taken(s.receive(try batch(1, good, cursor: 50), now: now))))
        #expect(ended(s.receive(try batch(2, good, cursor: 50), now: now))?.contains("is not past") == true)
        // A changed byte.
        var t = try stream()
        var tampered = try batch(1, good)
        tampered.ciphertext[3] ^= 1
        #expect(ended(t.receive(tampered, now: now))?.contains("does not authenticate") == true)
        // After its expiry and the grace.
        var late = try stream(expiresIn: 60)
        #expect(taken(late.receive(try batch(1, good), now: now.adding(.seconds(119)))) != nil, "within the minute's grace")
        #expect(ended(late.receive(try batch(1, good), now: now.adding(.seconds(121))))?.contains("expired") == true)
    }
}
