import Crypto
import DredgeEnvelope
import DredgeWire
import Foundation
import _CryptoExtras
import Testing

/// One RSA key for the suite: generating 3072-bit keys takes a while.
let agentKey = try! RSAPrivateKey.generate()
let otherKey = try! RSAPrivateKey.generate()

func sampleHeader(chunkCount: UInt32 = 3, plaintextSize: UInt64 = 10_000, prefix: [UInt8] = [1, 2, 3, 4, 5, 6, 7]) -> WireUploadHeader {
    WireUploadHeader.with {
        $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"
        $0.kind = .pull
        $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
        $0.noncePrefix = Data(prefix)
        $0.chunkSize = 4_096
        $0.plaintextSize = plaintextSize
        $0.chunkCount = chunkCount
        $0.createdAtUs = 1_795_340_401_000_000
    }
}

@Suite struct KeyWrapTests {
    @Test func aWrappedKeyUnwrapsOnlyWithTheMatchingPrivateKey() throws {
        let key = SymmetricKey.uploadKey()
        let wrapped = try agentKey.publicKey.wrapKey(key)
        #expect(wrapped.count == 384)
        #expect(try agentKey.unwrapKey(wrapped) == key)
        let wrong = #expect(throws: EnvelopeError.self) { try otherKey.unwrapKey(wrapped) }
        #expect(wrong?.code == .keyUnwrapFailed)
        var flipped = wrapped
        flipped[100] ^= 0x01
        #expect(throws: EnvelopeError.self) { try agentKey.unwrapKey(flipped) }
        #expect(throws: EnvelopeError.self) { try agentKey.unwrapKey([UInt8](repeating: 0, count: 10)) }
        // A wrapped value that is not 32 bytes is refused even though it decrypts.
        let short = try agentKey.publicKey.wrapKey(SymmetricKey(size: .bits128))
        let error = #expect(throws: EnvelopeError.self) { try agentKey.unwrapKey(short) }
        #expect(error?.code == .keyUnwrapFailed)
    }

    @Test func publicKeysRoundTripAndDeriveTheAgentID() throws {
        let publicKey = agentKey.publicKey
        let again = try RSAPublicKey(spki: publicKey.spki)
        #expect(again == publicKey)
        #expect(publicKey.agentID.count == 32)
        #expect(publicKey.agentID == Hex.encode(SHA256.hash(data: publicKey.spki).prefix(16)))
        #expect(publicKey.agentID != otherKey.publicKey.agentID)
        let reloaded = try RSAPrivateKey(pemRepresentation: agentKey.pemRepresentation)
        #expect(reloaded.publicKey == publicKey)
        #expect(throws: EnvelopeError.self) { try RSAPublicKey(spki: [0x30, 0x00]) }
        #expect(throws: EnvelopeError.self) { try RSAPrivateKey(pemRepresentation: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----") }
    }
}

@Suite struct CommandSigningTests {
    func command() -> WirePullCommand {
        WirePullCommand.with {
            $0.commandID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"
            $0.target = .with { $0.uid = "u-1002" }
            $0.filter = .with { $0.sinceUs = 1; $0.types = ["network"]; $0.levels = [.error] }
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.expiresAtUs = 1_795_344_000_000_000
            $0.wrappedKey = Data(repeating: 7, count: 384)
        }
    }

    @Test func signedCommandsVerifyAndAnyChangeBreaksThem() throws {
        let server = ServerSigningKey.generate()
        var c = command()
        try server.sign(&c)
        #expect(c.signature.count == 64)
        try server.verifyingKey.verify(c)

        var unsigned = c
        unsigned.signature = Data()
        #expect((#expect(throws: EnvelopeError.self) { try server.verifyingKey.verify(unsigned) })?.code == .unsigned)

        for tamper in [{ (c: inout WirePullCommand) in c.target.uid = "u-1" }, { $0.filter.clearSinceUs() }, { $0.expiresAtUs += 1 }, { $0.signature[3] ^= 1 }] {
            var t = c
            tamper(&t)
            #expect((#expect(throws: EnvelopeError.self) { try server.verifyingKey.verify(t) })?.code == .badSignature)
        }
        let impostor = ServerSigningKey.generate()
        var forged = command()
        try impostor.sign(&forged)
        #expect((#expect(throws: EnvelopeError.self) { try server.verifyingKey.verify(forged) })?.code == .badSignature)
        // The pinned key travels as 32 raw bytes.
        try CommandVerifier(rawRepresentation: server.verifyingKey.rawRepresentation).verify(c)
    }
}

@Suite struct AuthenticationTests {
    @Test func onlyTheKeyHolderAnswersTheChallenge() throws {
        let challenge = secureRandomBytes(32)
        let id = agentKey.publicKey.agentID
        let signature = try AgentAuthentication.sign(challenge: challenge, agentID: id, with: agentKey)
        #expect(AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: agentKey.publicKey))
        #expect(!AgentAuthentication.verify(signature: signature, challenge: secureRandomBytes(32), publicKey: agentKey.publicKey))
        #expect(!AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: otherKey.publicKey))
        // Signing the challenge under someone else's id does not authenticate as them.
        let stolen = try AgentAuthentication.sign(challenge: challenge, agentID: otherKey.publicKey.agentID, with: agentKey)
        #expect(!AgentAuthentication.verify(signature: stolen, challenge: challenge, publicKey: otherKey.publicKey))
    }
}

@Suite struct ChunkCipherTests {
    let key = SymmetricKey(data: [UInt8](repeating: 0x42, count: 32))

    func chunks(_ cipher: ChunkCipher) -> [[UInt8]] {
        (0..<cipher.header.chunkCount).map { [UInt8](repeating: UInt8($0), count: cipher.plaintextSize(ofChunk: $0)) }
    }

    @Test func sealedChunksOpenInPlace() throws {
        let cipher = try ChunkCipher(key: key, header: sampleHeader())
        #expect(cipher.plaintextSize(ofChunk: 2) == 10_000 - 2 * 4_096)
        #expect(cipher.nonce(index: 1) == [1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 1, 0])
        #expect(cipher.nonce(index: 2) == [1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 2, 1])
        for (i, plain) in chunks(cipher).enumerated() {
            let sealed = try cipher.seal(plain, index: UInt32(i))
            #expect(sealed.count == plain.count + 16)
            #expect(Array(try cipher.open(sealed, index: UInt32(i))) == plain)
            // As the server holds a chunk: `Data` from a decoded frame, here a slice that does
            // not start at index 0; one changed byte still fails.
            var framed = Data([0xAA, 0xBB, 0xCC])
            framed.append(contentsOf: sealed)
            #expect(Array(try cipher.open(framed.dropFirst(3), index: UInt32(i))) == plain)
            framed[framed.endIndex - 1] ^= 1
            #expect(throws: EnvelopeError.self) { try cipher.open(framed.dropFirst(3), index: UInt32(i)) }
        }
    }

    @Test func reorderingTamperingSplicingAndWrongKeysAreDetected() throws {
        let cipher = try ChunkCipher(key: key, header: sampleHeader(plaintextSize: 3 * 4_096))
        let sealed = try chunks(cipher).enumerated().map { try cipher.seal($1, index: UInt32($0)) }
        func fails(_ bytes: [UInt8], _ index: UInt32, with c: ChunkCipher) -> Bool {
            (try? c.open(bytes, index: index)) == nil
        }
        #expect(fails(sealed[0], 1, with: cipher), "reordered")
        #expect(fails(sealed[1], 2, with: cipher), "a middle chunk passed off as the last")
        var flipped = sealed[1]
        flipped[10] ^= 0x80
        #expect(fails(flipped, 1, with: cipher), "tampered")
        var tag = sealed[1]
        tag[tag.count - 1] ^= 1
        #expect(fails(tag, 1, with: cipher), "tampered tag")
        let otherUpload = try ChunkCipher(key: key, header: sampleHeader(plaintextSize: 3 * 4_096, prefix: [9, 9, 9, 9, 9, 9, 9]))
        #expect(fails(sealed[0], 0, with: otherUpload), "spliced from another upload")
        var relabelled = sampleHeader(plaintextSize: 3 * 4_096)
        relabelled.agentID = "someone-else"
        #expect(fails(sealed[0], 0, with: try ChunkCipher(key: key, header: relabelled)), "header not bound")
        // Truncation: a header claiming fewer chunks changes the associated data.
        let truncated = try ChunkCipher(key: key, header: sampleHeader(chunkCount: 2, plaintextSize: 2 * 4_096))
        #expect(fails(sealed[1], 1, with: truncated), "truncated upload")
        #expect(fails(sealed[0], 0, with: try ChunkCipher(key: SymmetricKey.uploadKey(), header: sampleHeader(plaintextSize: 3 * 4_096))), "wrong key")
        let error = #expect(throws: EnvelopeError.self) { try cipher.open(flipped, index: 1) }
        #expect(error?.code == .chunkAuthFailed)
    }

    @Test func inconsistentHeadersAreRefused() {
        for h in [
            sampleHeader(prefix: [1, 2, 3]),
            sampleHeader(chunkCount: 2),
            sampleHeader(chunkCount: 0, plaintextSize: 0),
            { var h = sampleHeader(); h.chunkSize = 100; return h }(),
            { var h = sampleHeader(); h.chunkSize = 2_000_000; h.chunkCount = 1; return h }(),
        ] {
            let error = #expect(throws: EnvelopeError.self) { try ChunkCipher(key: key, header: h) }
            #expect(error?.code == .invalidUpload)
        }
        // An empty upload still has one (empty) chunk.
        #expect((try? ChunkCipher(key: key, header: sampleHeader(chunkCount: 1, plaintextSize: 0))) != nil)
    }
}

@Suite struct PublicKeyEncodingTests {
    /// Only SubjectPublicKeyInfo DER is a public key on the wire: the agent id hashes those
    /// bytes, so the same key as PKCS#1 (another id) is refused.
    @Test func onlySPKIIsAccepted() throws {
        let key = try RSAPrivateKey.generate().publicKey
        #expect(try RSAPublicKey(spki: key.spki).agentID == key.agentID)
        let pkcs1 = try _RSA.Signing.PublicKey(derRepresentation: key.spki).pkcs1DERRepresentation
        #expect(Array(pkcs1) != key.spki)
        #expect(throws: EnvelopeError.self) { try RSAPublicKey(spki: pkcs1) }
    }
}
