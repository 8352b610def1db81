import Crypto
import DredgeAgentCore
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Testing

/// What an agent does with the server's announcements of new keys (README § Key rotation):
/// it takes a chain signed link by link, refuses anything else whole, and accepts commands
/// signed by an earlier generation only until it retires.
@Suite struct PinnedServerKeysTests {
    static let agentKey = try! RSAPrivateKey.generate()
    static let encryption = [try! RSAPrivateKey.generate(), try! RSAPrivateKey.generate(), try! RSAPrivateKey.generate()]
    let signing = [ServerSigningKey.generate(), ServerSigningKey.generate(), ServerSigningKey.generate()]
    let now = Timestamp(rfc3339: "2026-11-29T10:00:00Z")!

    /// The file of an agent enrolled with generation 1.
    var enrolled: AgentState.File {
        AgentState.File(
            agentID: Self.agentKey.publicKey.agentID, serverHost: "127.0.0.1", serverPort: 1, servers: nil,
            serverSigningKey: Hex.encode(signing[0].verifyingKey.rawRepresentation), serverEncryptionKey: Hex.encode(Self.encryption[0].publicKey.spki),
            enrolledAt: now.date, keyGeneration: 1)
    }

    /// Generation `number` (2 or 3) announced, signed by the key before it (or by `signer`).
    func announcement(_ number: Int, retiresIn: Int64 = 86_400, signer: ServerSigningKey? = nil) throws -> WireKeyAnnouncement {
        var a = WireKeyAnnouncement.with {
            $0.generation = UInt32(number)
            $0.signingKey = Data(signing[number - 1].verifyingKey.rawRepresentation)
            $0.encryptionKey = Data(Self.encryption[number - 1].publicKey.spki)
            $0.issuedAtUs = now.microseconds
            $0.previousRetiresAtUs = now.microseconds + retiresIn * 1_000_000
        }
        try (signer ?? signing[number - 2]).sign(&a)
        return a
    }

    func command(signedBy key: ServerSigningKey, id: String = "0123456789abcdef0123456789abcdef") throws -> WirePullCommand {
        var c = try WirePullCommand.with {
            $0.commandID = id
            $0.target = .with { $0.uid = "u-1"; $0.agentID = Self.agentKey.publicKey.agentID }
            $0.filter = LogFilter(uid: "u-1").wire
            $0.issuedAtUs = now.microseconds - 1_000_000
            $0.expiresAtUs = now.microseconds + 3_600_000_000
            $0.wrappedKey = Data(try Self.agentKey.publicKey.wrapKey(SymmetricKey(size: .bits256)))
        }
        try key.sign(&c)
        return c
    }

    @Test func aChainOfAnnouncementsIsTakenAndWrittenBack() throws {
        let keys = try PinnedServerKeys(enrolled)
        #expect(keys.generation == 1 && keys.isGenerationKnown && keys.said == 1)
        let after = try keys.adopting([try announcement(2), try announcement(3, retiresIn: 7_200)], now: now)
        #expect(after.generation == 3)
        #expect(after.signing.rawRepresentation == signing[2].verifyingKey.rawRepresentation)
        #expect(after.encryption == Self.encryption[2].publicKey)
        #expect(after.previous.map { $0.generation } == [1, 2])
        // Taking them again (the next ack repeats them until the server hears) changes nothing.
        #expect(try after.adopting([try announcement(2), try announcement(3)], now: now).generation == 3)

        var file = enrolled
        after.write(into: &file)
        let reread = try PinnedServerKeys(file)
        #expect(reread.generation == 3 && reread.previous.map { $0.generation } == [1, 2])
        #expect(reread.previous.map { $0.retiresAtUs } == after.previous.map { $0.retiresAtUs })
    }

    /// A state from a release that kept no generation says none, and starts the chain at the
    /// first announcement its key verifies, whatever its number (it may have enrolled after a
    /// rotation); one its key verifies nowhere is refused.
    @Test func aStateThatKeptNoGenerationStartsAtTheAnnouncementItsKeyVerifies() throws {
        var file = enrolled
        file.keyGeneration = nil
        let keys = try PinnedServerKeys(file)
        #expect(!keys.isGenerationKnown && keys.said == 0)
        // Its key is generation 1's; the server announces 2 and 3 (it recorded 1), or only 3
        // signed by the key it has (it recorded 2).
        #expect(try keys.adopting([try announcement(2), try announcement(3)], now: now).generation == 3)
        let skipping = try keys.adopting([try announcement(3, signer: signing[0])], now: now)
        #expect(skipping.generation == 3 && skipping.isGenerationKnown && skipping.said == 3)
        #expect(try keys.adopting([], now: now).said == 0)
        #expect(throws: PinnedServerKeys.Refusal.self) { try keys.adopting([try announcement(3)], now: now) }
        // A damaged file's generation is refused, not trapped on when said on the wire.
        for damaged in [0, -1, Int(UInt32.max), Int.max] {
            file.keyGeneration = damaged
            #expect(throws: AgentError.self, "\(damaged)") { try PinnedServerKeys(file) }
        }
    }

    @Test func anAnnouncementThatDoesNotHoldUpIsRefusedWhole() throws {
        let keys = try PinnedServerKeys(enrolled)
        let impostor = ServerSigningKey.generate()
        let cases: [(String, [WireKeyAnnouncement])] = [
            ("signed by another key", [try announcement(2, signer: impostor)]),
            ("skips a generation", [try announcement(3, signer: signing[0])]),
            ("a good first, a forged second", [try announcement(2), try announcement(3, signer: impostor)]),
            ("the previous generation already retired", [try announcement(2, retiresIn: -1)]),
            (
                "a signing key of the wrong size",
                [
                    try {
                        var a = try announcement(2)
                        a.signingKey = Data(repeating: 7, count: 31)
                        try signing[0].sign(&a)
                        return a
                    }()
                ]
            ),
            (
                "an encryption key that is not an RSA SubjectPublicKeyInfo",
                [
                    try {
                        var a = try announcement(2)
                        a.encryptionKey = Data(signing[1].verifyingKey.rawRepresentation)
                        try signing[0].sign(&a)
                        return a
                    }()
                ]
            ),
            (
                "a field changed after signing",
                [
                    try {
                        var a = try announcement(2)
                        a.previousRetiresAtUs += 1
                        return a
                    }()
                ]
            ),
        ]
        for (what, announcements) in cases {
            #expect(throws: PinnedServerKeys.Refusal.self, "\(what)") { try keys.adopting(announcements, now: now) }
        }
    }

    /// An earlier generation's signature is accepted until that generation retires, and not
    /// after; a key the agent never pinned never is.
    @Test func commandsSignedByTheRetiringKeyAreAcceptedUntilItRetires() throws {
        let keys = try PinnedServerKeys(enrolled).adopting([try announcement(2, retiresIn: 600)], now: now)
        var admission = PullAdmission(agentID: Self.agentKey.publicKey.agentID, serverKeys: keys, agentKey: Self.agentKey)
        guard case .accept = admission.admit(try command(signedBy: signing[1], id: "00000000000000000000000000000001"), now: now) else {
            Issue.record("the current key's command was not accepted")
            return
        }
        guard case .accept = admission.admit(try command(signedBy: signing[0], id: "00000000000000000000000000000002"), now: now) else {
            Issue.record("the retiring key's command was not accepted during the overlap")
            return
        }
        let later = now.adding(.seconds(601))
        var late = try command(signedBy: signing[0], id: "00000000000000000000000000000003")
        late.issuedAtUs = later.microseconds
        late.expiresAtUs = later.microseconds + 3_600_000_000
        try signing[0].sign(&late)
        guard case .reject(let reason, _) = admission.admit(late, now: later) else {
            Issue.record("the retired key's command was accepted")
            return
        }
        #expect(reason == .rejectBadSignature)
        guard case .reject(let impostor, _) = admission.admit(try command(signedBy: ServerSigningKey.generate(), id: "00000000000000000000000000000004"), now: now) else {
            Issue.record("an unknown key's command was accepted")
            return
        }
        #expect(impostor == .rejectBadSignature)
    }
}
