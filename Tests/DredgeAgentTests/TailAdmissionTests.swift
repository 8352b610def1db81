import Crypto
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Testing

/// An agent's checks on a tail command (Protocol § 20): each failure with its reason, in the
/// order of a pull command's; the accepted tail bound to its user, within its limits.
@Suite struct TailAdmissionTests {
    static let agentKey = try! RSAPrivateKey.generate()
    static let encryption = try! RSAPrivateKey.generate()
    let server = ServerSigningKey.generate()
    let now = Timestamp(rfc3339: "2026-11-30T10:00:00Z")!
    var agentID: String { Self.agentKey.publicKey.agentID }

    var keys: PinnedServerKeys {
        get throws {
            try PinnedServerKeys(
                AgentState.File(
                    agentID: agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil, serverSigningKey: Hex.encode(server.verifyingKey.rawRepresentation),
                    serverEncryptionKey: Hex.encode(Self.encryption.publicKey.spki), enrolledAt: now.date, keyGeneration: 1))
        }
    }

    func command(
        id: String = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a", _ change: (inout WireTailCommand) throws -> Void = { _ in }, signedBy signer: ServerSigningKey? = nil, key: SymmetricKey = SymmetricKey(size: .bits256)
    ) throws -> WireTailCommand {
        var c = try WireTailCommand.with {
            $0.tailID = id
            $0.target = .with { $0.uid = "u-1"; $0.agentID = agentID }
            $0.filter = .with { $0.levels = [.warning, .error]; $0.text = "timeout" }
            $0.issuedAtUs = now.microseconds - 1_000_000
            $0.expiresAtUs = now.microseconds + 900_000_000
            $0.maxRecordsPerS = 200
            $0.maxBytesPerS = 262_144
            $0.verbose = true
            $0.verboseTypes = ["player"]
            $0.wrappedKey = Data(try Self.agentKey.publicKey.wrapKey(key))
        }
        try change(&c)
        try (signer ?? server).sign(&c)
        return c
    }

    func admit(_ c: WireTailCommand, running: Set<String> = []) throws -> TailAdmission.Decision {
        TailAdmission.admit(c, agentID: agentID, serverKeys: try keys, agentKey: Self.agentKey, running: running, now: now)
    }

    func reason(_ d: TailAdmission.Decision) -> WireRejectReason? { if case .reject(let r, _) = d { r } else { nil } }

    @Test func aValidTailIsAcceptedBoundToItsUser() throws {
        let key = SymmetricKey(size: .bits256)
        guard case .accept(let a) = try admit(try command(key: key)) else { Issue.record("rejected"); return }
        #expect(a.uid == "u-1" && a.filter == LogFilter(uid: "u-1", levels: [.warning, .error], text: "timeout"))
        #expect(a.key == key && a.expiresAt.microseconds == now.microseconds + 900_000_000)
        #expect(a.recordsPerSecond == 200 && a.bytesPerSecond == 262_144 && a.verbose && a.verboseTypes == ["player"])
        #expect(try admit(try command()).frame(tailID: a.tailID, startCursor: 7).tailAccepted.startCursor == 7)
        // A filter that names the target's uid is the same tail; another uid is refused below.
        guard case .accept(let same) = try admit(try command { $0.filter.uid = "u-1" }) else { Issue.record("rejected"); return }
        #expect(same.filter.uid == "u-1")
    }

    @Test func eachFailureHasItsReasonInOrder() throws {
        var unsigned = try command()
        unsigned.signature = Data()
        #expect(reason(try admit(unsigned)) == .rejectUnsigned)
        var tampered = try command()
        tampered.target.uid = "u-2"
        #expect(reason(try admit(tampered)) == .rejectBadSignature, "the signature covers the target")
        var unverbose = try command()
        unverbose.verbose = false
        #expect(reason(try admit(unverbose)) == .rejectBadSignature, "and verbosity")
        #expect(reason(try admit(try command(signedBy: ServerSigningKey.generate()))) == .rejectBadSignature)
        #expect(reason(try admit(try command(id: "not-an-id"))) == .rejectInvalid)
        #expect(reason(try admit(try command { $0.expiresAtUs = now.microseconds })) == .rejectExpired)
        #expect(reason(try admit(try command { $0.issuedAtUs = now.microseconds + 600_000_000; $0.expiresAtUs = $0.issuedAtUs + 60_000_000 })) == .rejectExpired)
        #expect(reason(try admit(try command { $0.target.agentID = "0123456789abcdef0123456789abcdef" })) == .rejectNotForMe)
        #expect(reason(try admit(try command { $0.wrappedKey = Data(repeating: 1, count: 384) })) == .rejectBadKey)
        // Two defects at once: the earlier check gives the reason.
        #expect(reason(try admit(try command { $0.expiresAtUs = now.microseconds; $0.target.agentID = "0123456789abcdef0123456789abcdef" })) == .rejectExpired)
        #expect(reason(try admit(try command { $0.target.agentID = "0123456789abcdef0123456789abcdef"; $0.wrappedKey = Data(repeating: 1, count: 384) })) == .rejectNotForMe)
        #expect(reason(try admit(try command { $0.wrappedKey = Data(repeating: 1, count: 384); $0.maxRecordsPerS = 0 })) == .rejectBadKey)
        #expect(reason(try admit(try command(id: "not-an-id") { $0.expiresAtUs = now.microseconds })) == .rejectInvalid)
        // Exactly an hour is allowed.
        guard case .accept = try admit(try command { $0.expiresAtUs = $0.issuedAtUs + 3_600_000_000 }) else { Issue.record("an hour refused"); return }
        // Invalid terms, after the key.
        let invalid: [(String, (inout WireTailCommand) -> Void)] = [
            ("no target uid", { $0.target.uid = "" }),
            ("another user's filter", { $0.filter.uid = "u-2" }),
            ("longer than an hour", { $0.expiresAtUs = $0.issuedAtUs + 3_600_000_001 }),
            ("no records a second", { $0.maxRecordsPerS = 0 }),
            ("too many records a second", { $0.maxRecordsPerS = 10_001 }),
            ("too few bytes a second", { $0.maxBytesPerS = 1_023 }),
            ("too many bytes a second", { $0.maxBytesPerS = 16 * 1024 * 1024 + 1 }),
            ("a NUL in the text", { $0.filter.text = "a\u{0}b" }),
            ("not after it was issued", { [now] in $0.issuedAtUs = now.microseconds + 60_000_000; $0.expiresAtUs = $0.issuedAtUs }),
            ("a type that is not one", { $0.filter.types = ["Not A Type"] }),
            ("a verbose type that is not one", { $0.verboseTypes = ["x y"] }),
        ]
        for (what, change) in invalid {
            let d = try admit(try command(change))
            #expect(reason(d) == .rejectInvalid, "\(what)")
            #expect(d.frame(tailID: "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a", startCursor: 0).commandRejected.reason == .rejectInvalid)
        }
    }

    /// MAX_TAILS_PER_AGENT at once: the next is busy, last of all checks; one of those running,
    /// delivered again (a reconnection), is accepted again and not counted twice.
    @Test func aFifthTailIsBusyButARunningOneIsAcceptedAgain() throws {
        let running: Set<String> = ["00000000000000000000000000000001", "00000000000000000000000000000002", "00000000000000000000000000000003", "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"]
        #expect(reason(try admit(try command(id: "00000000000000000000000000000009"), running: running)) == .rejectBusy)
        #expect(reason(try admit(try command(id: "00000000000000000000000000000009") { $0.maxRecordsPerS = 0 }, running: running)) == .rejectInvalid, "busy comes last")
        guard case .accept = try admit(try command(), running: running) else { Issue.record("a running tail delivered again was refused"); return }
    }
}
