import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeExport

func hex(_ bytes: some Sequence<UInt8>) -> String { Hex.encode(bytes) }
func unhex(_ any: Any?) -> [UInt8] { Hex.decode(any as? String ?? "") ?? [] }

/// The protocol's crypto and payload vectors (Protocol/vectors/*.json). Inputs are fixed;
/// randomized outputs (RSA-OAEP, RSA-PSS) are fixed by the committed file and verified, and
/// everything deterministic is reproduced byte for byte.
@Suite(.serialized) struct ProtocolVectorTests {
    /// The fixed 3072-bit RSA test key: made once, then read from the committed vector.
    static func testKey() throws -> RSAPrivateKey {
        if let pem = Vectors.load("keywrap.json")?["rsa_private_key_pem"] as? String { return try RSAPrivateKey(pemRepresentation: pem) }
        return try RSAPrivateKey.generate()
    }

    static let aesKey = (0..<32).map { UInt8($0) }
    static let noncePrefix: [UInt8] = [0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6]
    static let ed25519Seed = (0..<32).map { UInt8(0x40 + $0) }

    @Test func keyWrap() throws {
        let key = try Self.testKey()
        let committed = Vectors.load("keywrap.json")
        var wrapped = unhex(committed?["wrapped_key"])
        if (try? key.unwrapKey(wrapped)) == nil && (Vectors.writing || wrapped.isEmpty) {
            wrapped = try key.publicKey.wrapKey(SymmetricKey(data: Self.aesKey))
        }
        #expect(try key.unwrapKey(wrapped) == SymmetricKey(data: Self.aesKey))
        let (file, produced) = try Vectors.check("keywrap.json", [
            "description": "RSA-OAEP-SHA256 (MGF1-SHA256, empty label) of a 32-byte AES key under a 3072-bit RSA key. OAEP is randomized: unwrap wrapped_key with the private key and compare with aes_key.",
            "rsa_private_key_pem": key.pemRepresentation,
            "rsa_public_key_spki": hex(key.publicKey.spki),
            "agent_id": key.publicKey.agentID,
            "aes_key": hex(Self.aesKey),
            "wrapped_key": hex(wrapped),
        ])
        #expect(file == produced)
    }

    @Test func authentication() throws {
        let key = try Self.testKey()
        let challenge = (0..<32).map { UInt8(0xC0 ^ $0) }
        let input = SigningInput.auth(challenge: challenge, agentID: key.publicKey.agentID)
        var signature = unhex(Vectors.load("auth.json")?["signature"])
        if !AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: key.publicKey) && (Vectors.writing || signature.isEmpty) {
            signature = try AgentAuthentication.sign(challenge: challenge, agentID: key.publicKey.agentID, with: key)
        }
        #expect(AgentAuthentication.verify(signature: signature, challenge: challenge, publicKey: key.publicKey))
        let (file, produced) = try Vectors.check("auth.json", [
            "description": "Agent authentication: RSA-PSS-SHA256 (MGF1-SHA256, salt 32) by the key of keywrap.json over the auth signing input. PSS is randomized: verify signature.",
            "challenge": hex(challenge),
            "agent_id": key.publicKey.agentID,
            "signing_input": hex(input),
            "signature": hex(signature),
        ])
        #expect(file == produced)
    }

    static func sampleCommand() -> WirePullCommand {
        WirePullCommand.with {
            $0.commandID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"
            $0.target = .with { $0.uid = "u-1002" }
            $0.filter = .with { $0.sinceUs = 1_795_100_000_000_000; $0.untilUs = 1_795_340_400_000_000; $0.uid = "u-1002"; $0.types = ["player", "network"]; $0.levels = [.error, .warning] }
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.expiresAtUs = 1_795_344_000_000_000
            $0.wrappedKey = Data(repeating: 0x77, count: 8)
        }
    }

    @Test func commandSignature() throws {
        let server = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        var command = Self.sampleCommand()
        try server.sign(&command)
        try server.verifyingKey.verify(command)
        let frame = try FrameEncoder.bytes(of: WireFrame.with { $0.pullCommand = command })
        let (file, produced) = try Vectors.check("command.json", [
            "description": "A pull command signed with Ed25519 (deterministic, RFC 8032) over its canonical signing input. Absent optional filter fields: text.",
            "ed25519_private_key": hex(Self.ed25519Seed),
            "ed25519_public_key": hex(server.verifyingKey.rawRepresentation),
            "command": [
                "command_id": command.commandID, "target_uid": command.target.uid, "target_agent_id": command.target.agentID,
                "since_us": command.filter.sinceUs, "until_us": command.filter.untilUs, "uid": command.filter.uid,
                "types": command.filter.types, "levels": command.filter.levels.map(\.rawValue),
                "issued_at_us": command.issuedAtUs, "expires_at_us": command.expiresAtUs, "wrapped_key": hex(command.wrappedKey),
            ] as [String: Any],
            "signing_input": hex(SigningInput.pullCommand(command)),
            "signature": hex(command.signature),
            "frame": hex(frame),
        ])
        #expect(file == produced)
    }

    static func headerFields(_ h: WireUploadHeader) -> [String: Any] {
        [
            "upload_id": h.uploadID, "kind": h.kind.rawValue, "agent_id": h.agentID, "nonce_prefix": hex(h.noncePrefix),
            "chunk_size": h.chunkSize, "plaintext_size": h.plaintextSize, "chunk_count": h.chunkCount,
            "wrapped_key": hex(h.wrappedKey), "empty": h.empty, "created_at_us": h.createdAtUs,
        ]
    }

    @Test func chunkEncryption() throws {
        let header = WireUploadHeader.with {
            $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.kind = .pull; $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
            $0.noncePrefix = Data(Self.noncePrefix); $0.chunkSize = 4_096; $0.plaintextSize = 4_096 + 100; $0.chunkCount = 2
            $0.createdAtUs = 1_795_340_401_000_000
        }
        let cipher = try ChunkCipher(key: SymmetricKey(data: Self.aesKey), header: header)
        let plaintexts = [(0..<4_096).map { UInt8($0 % 251) }, Array("the last chunk is short and carries the last-chunk flag in its nonce....................................".utf8.prefix(100))]
        var chunks: [[String: Any]] = []
        for (i, p) in plaintexts.enumerated() {
            let sealed = try cipher.seal(p, index: UInt32(i))
            #expect(try cipher.open(sealed, index: UInt32(i)) == p)
            chunks.append(["index": i, "nonce": hex(cipher.nonce(index: UInt32(i))), "plaintext": hex(p), "ciphertext_and_tag": hex(sealed)])
        }
        let (file, produced) = try Vectors.check("chunks.json", [
            "description": "AES-256-GCM chunk encryption. nonce = nonce_prefix || u32be(index) || last flag; associated data = SHA-256(header_canonical).",
            "key": hex(Self.aesKey),
            "header": Self.headerFields(header),
            "header_canonical": hex(SigningInput.uploadHeader(header)),
            "associated_data": hex(cipher.associatedData),
            "chunks": chunks,
        ])
        #expect(file == produced)
    }

    /// A complete small upload: fixed records → store → per-day JSONL → zip → sealed chunks.
    @Test func completeUpload() throws {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.retention.maxAge = .seconds(100 * 365 * 86_400)
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(exportContext)
        let base = Timestamp(rfc3339: "2026-11-20T23:59:58.250000Z")!
        let records: [(Int64, LogLevel, LogType, String, String, LogMetadata)] = [
            (0, .info, .network, "u-1002", "GET https://api.example.com/api/v2/cart -> 200 in 84 ms", ["http.status": 200, "duration_ms": 84]),
            (1_000_000, .warning, .player, "u-1002", "player buffering at 312s", ["track": "trk_1a2b3c"]),
            (2_500_000, .error, .business, "u-1002", "checkout failed: payment declined by issuer", ["order": "ORD-41872", "amount": 23.5]),
            (3_000_000, .notice, .app, "", "screen \"settings\" shown\twith a tab and é", [:]),
        ]
        for r in records {
            store.enqueue(LogEntry(timestamp: base.adding(.microseconds(r.0)), level: r.1, type: r.2, uid: r.3, message: r.4, metadata: r.5, context: ctx))
        }
        try store.flush()
        let createdAt = Timestamp(rfc3339: "2026-11-21T08:00:00Z")!
        let request = ExportRequest(uploadID: "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e", kind: .pull, agentID: "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f", commandID: "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e", filter: LogFilter(uid: "u-1002"), createdAt: createdAt)
        var options = ExportOptions()
        options.workers = 2
        let manifest = try Exporter.export(from: store, request, to: dir.file("export.zip"), options: options)
        #expect(manifest.days.map(\.file) == ["2026-11-20.jsonl", "2026-11-21.jsonl"])
        let zip = Array(FileManager.default.contents(atPath: dir.file("export.zip"))!)
        let upload = try SealedUpload(
            zipPath: dir.file("export.zip"), uploadID: request.uploadID, kind: .pull, agentID: request.agentID, key: SymmetricKey(data: Self.aesKey),
            empty: manifest.empty, createdAt: createdAt.microseconds, chunkSize: 4_096, noncePrefix: Self.noncePrefix)
        let chunks = try (0..<upload.header.chunkCount).map { hex(try upload.chunk($0)) }
        let payload = try PayloadExtractor.extract(zip: dir.file("export.zip"), into: dir.file("files"))
        var files: [String: String] = [:]
        for path in payload.files { files[(path as NSString).lastPathComponent] = contents(path) }
        let (file, produced) = try Vectors.check("upload.json", [
            "description": "A complete pull upload of uid u-1002's records: per-day JSONL files and manifest.json in a zip (deflate level 6 in 512 KiB blocks; zip bytes depend on the zlib build, the files do not), sealed in 4096-byte chunks with the key and nonce prefix given.",
            "key": hex(Self.aesKey),
            "header": Self.headerFields(upload.header),
            "header_canonical": hex(SigningInput.uploadHeader(upload.header)),
            "upload_begin_frame": hex(try FrameEncoder.bytes(of: WireFrame.with { $0.uploadBegin = .with { $0.header = upload.header } })),
            "zip": hex(zip),
            "chunks": chunks,
            "files": files,
            "manifest": String(decoding: try manifest.encoded(), as: UTF8.self),
        ])
        #expect(file == produced)
    }
}
