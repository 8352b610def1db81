import Crypto
import DredgeDomain
import DredgeEnvelope
@testable import DredgeServer
import Foundation
import Testing

/// The pull keys the issuer keeps in memory, so delivering a command needs no RSA
/// private-key operation: what it remembers is exactly what unwrapping gives, it remembers
/// only so many, and nothing wrapped under another key comes out of memory.
@Suite struct CommandIssuerTests {
    @Test func recentKeysKeepTheNewestAndForgetTheOldest() {
        let keys = RecentKeys(capacity: 3)
        let made = (0..<5).map { _ in (SymmetricKey(size: .bits256), secureRandomBytes(16)) }
        for (key, wrapped) in made { keys.insert(key, for: wrapped) }
        #expect(keys.count == 3)
        #expect(keys.key(for: made[0].1) == nil && keys.key(for: made[1].1) == nil)
        for (key, wrapped) in made[2...] { #expect(keys.key(for: wrapped) == key) }
        // Inserting one already held evicts nothing.
        keys.insert(made[2].0, for: made[2].1)
        #expect(keys.count == 3 && keys.key(for: made[3].1) == made[3].0)
    }

    @Test func aCommandCarriesThePullsKeyWhetherRememberedOrUnwrapped() throws {
        let serverKey = try RSAPrivateKey.generate(), agentKey = try RSAPrivateKey.generate()
        let issuer = CommandIssuer(encryptionKey: serverKey, signingKey: .generate())
        let made = try issuer.newPull(uid: "u", agentID: "a", filter: LogFilter(uid: "u"), targets: ["a"], lifetime: .seconds(60), requestedBy: "t")
        #expect(issuer.recentKeys.key(for: made.wrappedKey) != nil, "the key of a pull just made is remembered")
        let stored = StoredPull(id: made.id, uid: made.uid, filter: made.filter, issuedAt: made.issuedAt, expiresAt: made.expiresAt, wrappedKey: made.wrappedKey)
        let key = try serverKey.unwrapKey(made.wrappedKey)

        let remembered = try issuer.command(stored, agent: "a", agentKey: agentKey.publicKey)
        // A restarted server (or another node) remembers nothing: it unwraps, then remembers.
        let restarted = CommandIssuer(encryptionKey: serverKey, signingKey: .generate())
        #expect(restarted.recentKeys.count == 0)
        let unwrapped = try restarted.command(stored, agent: "a", agentKey: agentKey.publicKey)
        #expect(restarted.recentKeys.key(for: made.wrappedKey) == key)
        for command in [remembered, unwrapped] { #expect(try agentKey.unwrapKey(command.wrappedKey) == key) }

        // Another server's issuer cannot unwrap it, and a damaged wrapped key is not a remembered one.
        let other = CommandIssuer(encryptionKey: try RSAPrivateKey.generate(), signingKey: .generate())
        #expect(throws: UnreadablePull.self) { try other.command(stored, agent: "a", agentKey: agentKey.publicKey) }
        var damaged = stored
        damaged.wrappedKey[7] ^= 1
        #expect(throws: UnreadablePull.self) { try issuer.command(damaged, agent: "a", agentKey: agentKey.publicKey) }
    }
}
