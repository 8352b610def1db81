import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeReception
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

    /// The announcement of a generation of the server's keys (README § Key rotation): signed
    /// by generation 1's key (command.json's), for generation 2's Ed25519 key and keywrap.json's
    /// RSA key, and the heartbeat ack that carries it.
    @Test func keyAnnouncement() throws {
        let previous = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        let nextSeed = (0..<32).map { UInt8(0x60 + $0) }
        let next = try ServerSigningKey(rawRepresentation: nextSeed)
        let encryption = try Self.testKey().publicKey
        var announcement = WireKeyAnnouncement.with {
            $0.generation = 2
            $0.signingKey = Data(next.verifyingKey.rawRepresentation)
            $0.encryptionKey = Data(encryption.spki)
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.previousRetiresAtUs = 1_797_932_400_000_000
        }
        try previous.sign(&announcement)
        #expect(previous.verifyingKey.isValid(announcement))
        #expect(!next.verifyingKey.isValid(announcement))
        let frame = try FrameEncoder.bytes(of: WireFrame.with { $0.heartbeatAck = .with { $0.seq = 7; $0.keyAnnouncements = [announcement] } })
        let (file, produced) = try Vectors.check("key_announcement.json", [
            "description": "The announcement of generation 2 of the server's keys, signed with Ed25519 (deterministic) by generation 1's key over the announcement signing input, and a HeartbeatAck (seq 7) carrying it.",
            "previous_ed25519_private_key": hex(Self.ed25519Seed),
            "previous_ed25519_public_key": hex(previous.verifyingKey.rawRepresentation),
            "next_ed25519_private_key": hex(nextSeed),
            "announcement": [
                "generation": Int(announcement.generation), "signing_key": hex(announcement.signingKey), "encryption_key": hex(announcement.encryptionKey),
                "issued_at_us": announcement.issuedAtUs, "previous_retires_at_us": announcement.previousRetiresAtUs,
            ] as [String: Any],
            "signing_input": hex(SigningInput.keyAnnouncement(announcement)),
            "signature": hex(announcement.signature),
            "frame": hex(frame),
        ])
        #expect(file == produced)
    }

    /// A live tail (README § 20): a command signed by command.json's key, and one batch sealed
    /// under a tail key, with the frames of the exchange.
    @Test func liveTail() throws {
        let server = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        var command = WireTailCommand.with {
            $0.tailID = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"
            $0.target = .with { $0.uid = "u-1002"; $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f" }
            $0.filter = .with { $0.uid = "u-1002"; $0.types = ["player", "network"]; $0.levels = [.error, .warning, .info]; $0.text = "timeout" }
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.expiresAtUs = 1_795_341_300_000_000
            $0.maxRecordsPerS = 200
            $0.maxBytesPerS = 262_144
            $0.verbose = true
            $0.verboseTypes = ["player"]
            $0.wrappedKey = Data(repeating: 0x77, count: 8)
        }
        try server.sign(&command)
        #expect(server.verifyingKey.isValid(command))
        var changed = command
        changed.verbose = false
        #expect(!server.verifyingKey.isValid(changed), "the signature covers verbose")

        let tailKey = (0..<32).map { UInt8(0x90 + $0) }
        let agentID = command.target.agentID
        let cipher = try TailCipher(key: SymmetricKey(data: tailKey), tailID: command.tailID, agentID: agentID)
        let plaintext = Array(
            #"{"contexts":{"1":{"app":"oven-control","appVersion":"2.4.1","extra":{},"host":"kitchen-oven-0042","os":"Debian 12","process":"ovend"}},"records":[{"ts":"2026-11-21T10:40:01.250000Z","level":"warning","type":"network","uid":"u-1002","message":"GET /recipes timeout after 5000 ms","metadata":{"http.status":504},"context":1}]}"#
                .utf8)
        let (seq, dropped, cursor): (UInt64, UInt64, UInt64) = (3, 2, 60_517)
        let nonce = (0..<12).map { UInt8(0xE0 + $0) }
        let (_, sealed) = try cipher.seal(plaintext, seq: seq, dropped: dropped, cursor: cursor, nonce: nonce)
        #expect(Array(try cipher.open(sealed, nonce: nonce, seq: seq, dropped: dropped, cursor: cursor)) == plaintext)
        #expect(throws: EnvelopeError.self) { try cipher.open(sealed, nonce: nonce, seq: seq + 1, dropped: dropped, cursor: cursor) }
        #expect(throws: EnvelopeError.self) { try cipher.open(sealed, nonce: nonce, seq: seq, dropped: 0, cursor: cursor) }
        #expect(throws: EnvelopeError.self) { try cipher.open(sealed, nonce: nonce, seq: seq, dropped: dropped, cursor: cursor - 1) }
        #expect(throws: EnvelopeError.self) {
            try TailCipher(key: SymmetricKey(data: tailKey), tailID: command.tailID, agentID: "0" + agentID.dropFirst()).open(sealed, nonce: nonce, seq: seq, dropped: dropped, cursor: cursor)
        }
        // On the wire each batch has a nonce of its own.
        #expect(try cipher.seal(plaintext, seq: seq, dropped: dropped, cursor: cursor).nonce != cipher.seal(plaintext, seq: seq, dropped: dropped, cursor: cursor).nonce)

        let frames: [(String, WireFrame)] = [
            ("tail_command", .with { $0.tailCommand = command }),
            ("tail_accepted", .with { $0.tailAccepted = .with { $0.tailID = command.tailID; $0.startCursor = 60_000 } }),
            ("tail_batch", .with { $0.tailBatch = .with { $0.tailID = command.tailID; $0.seq = seq; $0.dropped = dropped; $0.cursor = cursor; $0.nonce = Data(nonce); $0.ciphertext = Data(sealed) } }),
            ("tail_ack", .with { $0.tailAck = .with { $0.tailID = command.tailID; $0.seq = seq; $0.cursor = cursor } }),
            ("tail_stop", .with { $0.tailStop = .with { $0.tailID = command.tailID; $0.reason = "stopped by alice" } }),
        ]
        let (file, produced) = try Vectors.check("tail.json", [
            "description": "A live tail (README § 20): a tail command signed with Ed25519 (deterministic) by command.json's key over the tail signing input; a batch sealed with AES-256-GCM under the tail key (a nonce fixed here, random on the wire; the canonical tail-batch associated data); and the frames of the exchange.",
            "ed25519_private_key": hex(Self.ed25519Seed),
            "command": [
                "tail_id": command.tailID, "target_uid": command.target.uid, "target_agent_id": command.target.agentID, "uid": command.filter.uid,
                "types": command.filter.types, "levels": command.filter.levels.map(\.rawValue), "text": command.filter.text,
                "issued_at_us": command.issuedAtUs, "expires_at_us": command.expiresAtUs, "max_records_per_s": Int(command.maxRecordsPerS),
                "max_bytes_per_s": Int(command.maxBytesPerS), "verbose": command.verbose, "verbose_types": command.verboseTypes, "wrapped_key": hex(command.wrappedKey),
            ] as [String: Any],
            "signing_input": hex(SigningInput.tailCommand(command)),
            "signature": hex(command.signature),
            "batch": [
                "tail_key": hex(tailKey), "agent_id": agentID, "seq": Int(seq), "dropped": Int(dropped), "cursor": Int(cursor), "plaintext": hex(plaintext),
                "nonce": hex(nonce), "associated_data": hex(cipher.associatedData(seq: seq, dropped: dropped, cursor: cursor)), "ciphertext": hex(sealed),
            ] as [String: Any],
            "frames": try frames.map { ["name": $0.0, "hex": hex(try FrameEncoder.bytes(of: $0.1))] },
        ])
        #expect(file == produced)
    }

    /// Triggers and captures (README § 21): a trigger set signed by command.json's key, a
    /// capture's upload header and its canonical form, and the matching rule and version order
    /// on cases whose verdicts are written here (the Python check derives them on its own).
    @Test func triggers() throws {
        let server = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        let agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
        let declined = WireTrigger.with {
            $0.triggerID = "7a0b1c2d3e4f50617283940a1b2c3d4e"
            $0.name = "payment declined"
            $0.match = .with { $0.levels = [.critical, .error]; $0.types = ["business", "app.checkout"]; $0.text = "payment declined" }
            $0.app = "shop"
            $0.minAppVersion = "2.0"
            $0.maxAppVersion = "2.10"
            $0.beforeS = 300
            $0.afterS = 60
            $0.maxPerDeviceDay = 3
            $0.expiresAtUs = 1_795_945_200_000_000
        }
        let unavailable = WireTrigger.with {
            $0.triggerID = "8b1c2d3e4f50617283940a1b2c3d4e5f"
            $0.name = "checkout 503 — or a crash"
            $0.match = .with { $0.metadataKey = "http.status"; $0.metadataValue = "503" }
            $0.crash = true
            $0.beforeS = 600
            $0.afterS = 0
            $0.maxPerDeviceDay = 10
            $0.expiresAtUs = 1_795_945_200_000_000
        }
        let flagged = WireTrigger.with {
            $0.triggerID = "9c2d3e4f50617283940a1b2c3d4e5f60"
            $0.name = "u-7 flagged"
            $0.match = .with { $0.metadataKey = "flag" }
            $0.uid = "u-7"
            $0.beforeS = 60
            $0.afterS = 60
            $0.maxPerDeviceDay = 1
            $0.expiresAtUs = 1_795_945_200_000_000
        }
        let cafe = WireTrigger.with {
            $0.triggerID = "ad3e4f50617283940a1b2c3d4e5f6071"
            $0.name = "café"
            $0.match = .with { $0.text = "café" }
            $0.beforeS = 0
            $0.afterS = 0
            $0.maxPerDeviceDay = 100
            $0.expiresAtUs = 1_795_945_200_000_000
        }
        let crashes = WireTrigger.with {
            $0.triggerID = "be4f50617283940a1b2c3d4e5f607182"
            $0.name = "oven crashes"
            $0.crash = true
            $0.app = "oven-control"
            $0.beforeS = 900
            $0.afterS = 0
            $0.maxPerDeviceDay = 5
            $0.expiresAtUs = 1_795_945_200_000_000
        }
        var set = WireTriggerSet.with {
            $0.agentID = agentID
            $0.version = 42
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.triggers = [declined, unavailable, flagged, cafe, crashes]
        }
        try server.sign(&set)
        #expect(server.verifyingKey.isValid(set))
        for change in [{ (s: inout WireTriggerSet) in s.version = 43 }, { $0.agentID = "0" + agentID.dropFirst() }, { $0.triggers[1].crash = false },
            { $0.triggers[0].match.levels = [.error] }, { $0.triggers.swapAt(0, 1) }, { $0.triggers[2].match.clearMetadataKey() }] {
            var changed = set
            change(&changed)
            #expect(!server.verifyingKey.isValid(changed), "the signature covers every field")
        }
        let rules = try TriggerSetTerms.check(set)
        #expect(rules.map(\.id) == set.triggers.map(\.triggerID))

        // The cases: (trigger, record, fires).
        func record(_ message: String, _ level: LogLevel = .error, _ type: String = "business", uid: String = "u-1002", metadata: String? = nil, app: String = "shop", version: String = "2.4.1") -> MatchableRecord {
            MatchableRecord(level: level, type: type, uid: uid, message: message, metadata: metadata, app: app, appVersion: version)
        }
        let cases: [(Int, MatchableRecord, Bool)] = [
            (0, record("Payment DECLINED by the bank"), true),
            (0, record("payment declined", .warning), false),
            (0, record("payment declined", .critical), true),
            (0, record("payment declined", .error, "network"), false),
            (0, record("checkout failed", metadata: #"{"reason":"Payment declined: insufficient funds"}"#), true),
            (0, record("payment declined", version: "2.11"), false),
            (0, record("payment declined", version: "2.10.0"), true),
            (0, record("payment declined", version: "1.99"), false),
            (0, record("payment declined", version: "02.0"), true),
            (0, record("payment declined", app: "shop-admin"), false),
            (0, record("payment refused"), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":503}"#, app: "any"), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":"503"}"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"duration_ms":84,"http.status":503}"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http\u002estatus":503}"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":5030}"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":503.0}"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":[503]}"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"response":{"http.status":503}}"#), false),
            (1, record("http.status=503 in the message only", .info, "network"), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"HTTP.STATUS":503}"#), false),
            (2, record("anything", .debug, "app", uid: "u-7", metadata: #"{"flag":false}"#), true),
            (2, record("anything", .debug, "app", uid: "u-7", metadata: #"{"flag":null}"#), true),
            (2, record("anything", .debug, "app", uid: "u-8", metadata: #"{"flag":false}"#), false),
            (2, record("anything", .debug, "app", uid: "u-7", metadata: #"{"flags":1}"#), false),
            (2, record("anything", .debug, "app", uid: "u-7"), false),
            (3, record("CAFé au lait", .info, "app"), true),
            (3, record("CAFÉ AU LAIT", .info, "app"), false),
            (3, record("le café", .info, "app"), true),
            (3, record("ok", .info, "app", metadata: #"{"note":"café"}"#), true),
            (0, record("payment declined", .error, "app.checkout"), true),
            (0, record("payment declined", version: ""), false),
            (0, record("payment declined", version: "2.10a"), false),
            (0, record("payment declined", version: "2.9z"), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{ "http.status" : 503 }"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":1,"http.status":503}"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":"50\u0033"}"#), true),
            (1, record("GET /checkout", .info, "network", metadata: #"[["http.status",503]]"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"[1]"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":503} trailing"#), false),
            (1, record("GET /checkout", .info, "network", metadata: #"{"http.status":5.03E2}"#), false),
            (2, record("anything", .debug, "app", uid: "u-7", metadata: #"{"flag":{}}"#), true),
            (4, record("anything", .critical, "app", metadata: #"{"flag":true}"#, app: "oven-control"), false),
        ]
        for (index, (trigger, rec, fires)) in cases.enumerated() {
            #expect(rules[trigger].fires(on: rec) == fires, "case \(index): \(rec.message) \(rec.metadata ?? "")")
        }
        #expect(rules[1].fires(onCrashOf: "u-1", app: "x", appVersion: "1"))
        #expect(rules[4].fires(onCrashOf: "", app: "oven-control", appVersion: "3.1") && !rules[4].fires(onCrashOf: "", app: "shop", appVersion: "3.1"))
        #expect(!rules[0].fires(onCrashOf: "u-1", app: "shop", appVersion: "2.4"), "not a crash trigger")
        #expect(!rules[2].fires(onCrashOf: "u-8", app: "x", appVersion: "1"), "another user's run")

        let versions: [(String, String, Int)] = [
            ("1.10", "1.9", 1), ("2", "2.0.0", 0), ("1.2.0-beta", "1.2.0", 1), ("01.2", "1.2", 0), ("1.a", "1.b", -1), ("10", "9", 1),
            ("1.2", "1.2.1", -1), ("99999999999999999999999", "100000000000000000000000", -1), ("2.0", "2.0.a", 1), ("1..2", "1.0.2", -1),
            ("10a", "9", 1), ("10", "10a", -1), ("10a", "11", -1), ("a", "1", -1), ("2.0.0-rc1", "2.0.0-rc2", -1), ("1.9", "1.10-beta", -1),
        ]
        for (a, b, order) in versions {
            #expect(AppVersionOrder.compare(a, b) == order, "\(a) against \(b)")
            #expect(AppVersionOrder.compare(b, a) == -order, "\(b) against \(a)")
        }

        // A capture of the second trigger: its header and canonical form.
        let header = WireUploadHeader.with {
            $0.uploadID = "c0ffee00112233445566778899aabbcc"
            $0.kind = .capture
            $0.agentID = agentID
            $0.noncePrefix = Data(Self.noncePrefix)
            $0.chunkSize = 262_144
            $0.plaintextSize = 9_000
            $0.chunkCount = 1
            $0.wrappedKey = Data(repeating: 0x5A, count: 8)
            $0.createdAtUs = 1_795_341_100_000_000
            $0.capture = .with {
                $0.triggerID = unavailable.triggerID
                $0.setVersion = set.version
                $0.uid = "u-1002"
                $0.sinceUs = 1_795_340_400_250_000
                $0.untilUs = 1_795_341_000_250_001
                $0.matchedAtUs = 1_795_341_000_250_000
                $0.crash = false
            }
        }
        var plain = header
        plain.clearCapture()
        plain.kind = .pull
        var stillPlain = plain
        stillPlain.capture = header.capture
        #expect(SigningInput.uploadHeader(stillPlain) == SigningInput.uploadHeader(plain), "another kind's header ends as before, capture or not")

        let frames: [(String, WireFrame)] = [
            ("trigger_set", .with { $0.triggerSet = set }),
            ("trigger_set_ack", .with { $0.triggerSetAck = .with { $0.version = set.version; $0.issuedAtUs = set.issuedAtUs } }),
            ("trigger_set_ack_refused", .with {
                $0.triggerSetAck = .with { $0.version = 41; $0.issuedAtUs = set.issuedAtUs - 1; $0.reason = .rejectExpired; $0.detail = "older than the set held" }
            }),
            ("upload_begin", .with { $0.uploadBegin = .with { $0.header = header } }),
            ("error_budget_spent", .with { $0.error = .with { $0.code = .errorBudgetSpent; $0.detail = "trigger spent its budget"; $0.uploadID = header.uploadID } }),
        ]
        func triggerFields(_ t: WireTrigger) -> [String: Any] {
            var fields: [String: Any] = [
                "trigger_id": t.triggerID, "name": t.name, "crash": t.crash, "uid": t.uid, "app": t.app, "min_app_version": t.minAppVersion,
                "max_app_version": t.maxAppVersion, "before_s": Int(t.beforeS), "after_s": Int(t.afterS), "max_per_device_day": Int(t.maxPerDeviceDay),
                "expires_at_us": t.expiresAtUs,
            ]
            if t.hasMatch {
                var m: [String: Any] = ["levels": t.match.levels.map(\.rawValue), "types": t.match.types]
                if t.match.hasText { m["text"] = t.match.text }
                if t.match.hasMetadataKey { m["metadata_key"] = t.match.metadataKey }
                if t.match.hasMetadataValue { m["metadata_value"] = t.match.metadataValue }
                fields["match"] = m
            }
            return fields
        }
        let c = header.capture
        let (file, produced) = try Vectors.check("triggers.json", [
            "description": "Triggers and captures (README § 21): a trigger set signed with Ed25519 (deterministic) by command.json's key over the trigger-set signing input, and its frame; a capture's upload header (kind 4), its canonical form and associated data (§12); the matching rule on records (trigger is an index into set.triggers; metadata null: the record has none) and the app version order (order: -1, 0 or 1 as a is before, equal to or after b).",
            "ed25519_private_key": hex(Self.ed25519Seed),
            "set": ["agent_id": set.agentID, "version": Int(set.version), "issued_at_us": set.issuedAtUs, "triggers": set.triggers.map(triggerFields)] as [String: Any],
            "signing_input": hex(SigningInput.triggerSet(set)),
            "signature": hex(set.signature),
            "capture_header": [
                "upload_id": header.uploadID, "kind": Int(header.kind.rawValue), "agent_id": header.agentID, "nonce_prefix": hex(header.noncePrefix),
                "chunk_size": Int(header.chunkSize), "plaintext_size": Int(header.plaintextSize), "chunk_count": Int(header.chunkCount),
                "wrapped_key": hex(header.wrappedKey), "empty": header.empty, "created_at_us": header.createdAtUs,
                "capture": [
                    "trigger_id": c.triggerID, "set_version": Int(c.setVersion), "uid": c.uid, "since_us": c.sinceUs, "until_us": c.untilUs,
                    "matched_at_us": c.matchedAtUs, "crash": c.crash,
                ] as [String: Any],
            ] as [String: Any],
            "capture_header_canonical": hex(SigningInput.uploadHeader(header)),
            "capture_associated_data": hex(SHA256.hash(data: SigningInput.uploadHeader(header))),
            "matching": cases.map { trigger, r, fires in
                [
                    "trigger": trigger, "level": r.level.rawValue, "type": r.type, "uid": r.uid, "message": r.message, "metadata": r.metadata ?? NSNull(),
                    "app": r.app, "app_version": r.appVersion, "fires": fires,
                ] as [String: Any]
            },
            "versions": versions.map { ["a": $0.0, "b": $0.1, "order": $0.2] as [String: Any] },
            "frames": try frames.map { ["name": $0.0, "hex": hex(try FrameEncoder.bytes(of: $0.1))] },
        ])
        #expect(file == produced)
    }

    /// A pull command an engineer marked urgent (§ 22, capability `urgent`): the mark is in the
    /// signing input only when set, so the same command not urgent signs as before (its input
    /// is a prefix of the urgent one's), and a signature over one never verifies the other.
    @Test func urgentCommand() throws {
        let server = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        var plain = WirePullCommand.with {
            $0.commandID = "5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
            $0.target = .with { $0.uid = "u-1" }
            $0.filter = .with { $0.uid = "u-1"; $0.sinceUs = 1_795_336_800_000_000 }
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.expiresAtUs = 1_795_344_000_000_000
            $0.wrappedKey = Data(repeating: 0x55, count: 8)
        }
        var urgent = plain
        urgent.urgent = true
        try server.sign(&plain)
        try server.sign(&urgent)
        let (plainInput, urgentInput) = (SigningInput.pullCommand(plain), SigningInput.pullCommand(urgent))
        #expect(Array(urgentInput.prefix(plainInput.count)) == plainInput && urgentInput.count == plainInput.count + 1)
        var forged = plain
        forged.urgent = true  // the mark added to a command signed without it
        #expect(!server.verifyingKey.isValid(forged))
        #expect(server.verifyingKey.isValid(urgent))
        let (file, produced) = try Vectors.check("command_urgent.json", [
            "description": "A pull command marked urgent (§22: PullCommand.urgent, field 8, with the capability `urgent`), signed with command.json's Ed25519 key. The mark is the last item of the signing input (a boolean, 0x01), present only when set: the same command without it signs as in command.json.",
            "command": [
                "command_id": urgent.commandID, "target_uid": urgent.target.uid, "target_agent_id": urgent.target.agentID,
                "since_us": urgent.filter.sinceUs, "uid": urgent.filter.uid,
                "issued_at_us": urgent.issuedAtUs, "expires_at_us": urgent.expiresAtUs, "wrapped_key": hex(urgent.wrappedKey), "urgent": true,
            ] as [String: Any],
            "signing_input": hex(urgentInput),
            "signature": hex(urgent.signature),
            "signing_input_not_urgent": hex(plainInput),
            "signature_not_urgent": hex(plain.signature),
            "frame": hex(try FrameEncoder.bytes(of: WireFrame.with { $0.pullCommand = urgent })),
        ])
        #expect(file == produced)
    }

    /// A command with a text filter (non-ASCII, addressed to an agent, no uid), and the §10
    /// matching rule on a few records: Swift's store and the Python check must agree on each.
    @Test func textFilterCommand() throws {
        let server = try ServerSigningKey(rawRepresentation: Self.ed25519Seed)
        var command = WirePullCommand.with {
            $0.commandID = "3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f"
            $0.target = .with { $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f" }
            $0.filter = .with { $0.untilUs = 1_795_340_400_000_000; $0.text = "Déclin" }
            $0.issuedAtUs = 1_795_340_400_000_000
            $0.expiresAtUs = 1_795_344_000_000_000
            $0.wrappedKey = Data(repeating: 0x77, count: 8)
        }
        try server.sign(&command)
        // (message, metadata, text, matches)
        let cases: [(String, LogMetadata, String, Bool)] = [
            ("Payment DÉCLINÉ by issuer", [:], "Déclin", false),  // é and É differ: only ASCII letters fold
            ("payment déclined", [:], "Déclin", true),
            ("PAYMENT DECLINED", [:], "declined", true),
            ("checkout", ["status": 503], "\"status\":503", true),  // metadata as serialized (§13)
            ("checkout", ["status": 503], "status: 503", false),
            ("checkout", ["path": "/api/v2"], "/api/v2", true),  // '/' is not escaped
            ("checkout", ["note": "line1\nline2"], "line1\\nline2", true),  // a newline is \n in the metadata text
            ("100% sure", [:], "0% s", true),
            ("1000 sure", [:], "0% s", false),  // % is no wildcard
            ("a_b", [:], "a_b", true),
            ("axb", [:], "a_b", false),  // nor is _
            ("no metadata here", [:], "{}", false),  // a record without metadata has no metadata text
        ]
        let dir = TempDir()
        let store = try LogStore(path: dir.file("logs.sqlite"))
        let ctx = try store.register(exportContext)
        var rendered: [[String: Any]] = []
        for (i, c) in cases.enumerated() {
            let entry = LogEntry(timestamp: Timestamp(microseconds: 1_795_000_000_000_000 + Int64(i)), level: .info, type: .app, uid: "u", message: "\(i)|" + c.0, metadata: c.1, context: ctx)
            store.enqueue(entry)
            var w = JSONWriter()
            w.writeObject(c.1)
            rendered.append(["message": c.0, "metadata": c.1.isEmpty ? NSNull() : w.string as Any, "text": c.2, "matches": c.3])
        }
        try store.flush()
        for (i, c) in cases.enumerated() {
            var found = false
            try store.forEachRecord(matching: LogFilter(text: c.2)) { if $0.message == "\(i)|" + c.0 { found = true } }
            #expect(found == c.3, "\(c)")
        }
        let (file, produced) = try Vectors.check("command_text.json", [
            "description": "A pull command with a text filter (and no uid), signed with command.json's Ed25519 key; and the text rule of §10 on records: `metadata` is the record's metadata as serialized in its line (null: the record has none), `matches` whether `text` selects it.",
            "command": [
                "command_id": command.commandID, "target_uid": command.target.uid, "target_agent_id": command.target.agentID,
                "until_us": command.filter.untilUs, "text": command.filter.text,
                "issued_at_us": command.issuedAtUs, "expires_at_us": command.expiresAtUs, "wrapped_key": hex(command.wrappedKey),
            ] as [String: Any],
            "signing_input": hex(SigningInput.pullCommand(command)),
            "signature": hex(command.signature),
            "frame": hex(try FrameEncoder.bytes(of: WireFrame.with { $0.pullCommand = command })),
            "matching": rendered,
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
            #expect(Array(try cipher.open(sealed, index: UInt32(i))) == p)
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

    typealias Record = (Int64, LogLevel, LogType, String, String, LogMetadata)

    /// Fixed records → store → per-day JSONL → zip → sealed chunks, written to (or compared with)
    /// `name`. Returns the upload and the vector's fields.
    static func uploadVector(
        _ name: String, description: String, records: [Record], base: Timestamp, request: ExportRequest, chunkSize: Int = 4_096,
        wrappedKey: [UInt8] = [], feedback: WireFeedback? = nil, filesAsDigests: Bool = false
    ) throws -> (committed: String?, produced: String) {
        let dir = TempDir()
        var config = StoreConfiguration()
        config.retention.maxAge = .seconds(100 * 365 * 86_400)
        config.retention.maxBytes = 1 << 40
        let store = try LogStore(path: dir.file("logs.sqlite"), configuration: config)
        let ctx = try store.register(exportContext)
        for r in records {
            store.enqueue(LogEntry(timestamp: base.adding(.microseconds(r.0)), level: r.1, type: r.2, uid: r.3, message: r.4, metadata: r.5, context: ctx))
        }
        try store.flush()
        var options = ExportOptions()
        options.workers = 2
        let manifest = try Exporter.export(from: store, request, to: dir.file("export.zip"), options: options)
        let zip = Array(FileManager.default.contents(atPath: dir.file("export.zip")) ?? Data())
        let upload = try SealedUpload(
            zipPath: dir.file("export.zip"), uploadID: request.uploadID, kind: request.kind == .feedback ? .feedback : .pull, agentID: request.agentID,
            key: SymmetricKey(data: Self.aesKey), wrappedKey: wrappedKey, feedback: feedback,
            empty: manifest.empty, createdAt: request.createdAt.microseconds, chunkSize: chunkSize, noncePrefix: Self.noncePrefix)
        let chunks = try (0..<upload.header.chunkCount).map { hex(try upload.chunk($0)) }
        let payload = try PayloadExtractor.extract(zip: dir.file("export.zip"), into: dir.file("files"))
        #expect(payload.manifest == manifest)
        var files: [String: String] = [:]
        for path in payload.files { files[(path as NSString).lastPathComponent] = contents(path) }
        var header = Self.headerFields(upload.header)
        if let feedback {
            header["feedback"] = ["feedback_id": feedback.feedbackID, "uid": feedback.uid, "text": feedback.text, "created_at_us": feedback.createdAtUs] as [String: Any]
        }
        var fields: [String: Any] = [
            "description": description,
            "key": hex(Self.aesKey),
            "header": header,
            "header_canonical": hex(SigningInput.uploadHeader(upload.header)),
            "upload_begin_frame": hex(try FrameEncoder.bytes(of: WireFrame.with { $0.uploadBegin = .with { $0.header = upload.header } })),
            "zip": hex(zip),
            "chunks": chunks,
            "manifest": String(decoding: try manifest.encoded(), as: UTF8.self),
        ]
        if filesAsDigests {
            fields["files_sha256"] = files.mapValues { hex(SHA256.hash(data: Data($0.utf8))) }
        } else {
            fields["files"] = files
        }
        return try Vectors.check(name, fields)
    }

    /// A pull's export request: the upload id is the command id, the vectors' agent id.
    static func pullRequest(_ id: String, filter: LogFilter) -> ExportRequest {
        ExportRequest(uploadID: id, kind: .pull, agentID: "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f", commandID: id, filter: filter, createdAt: uploadCreatedAt)
    }

    static let uploadBase = Timestamp(rfc3339: "2026-11-20T23:59:58.250000Z")!
    static let uploadCreatedAt = Timestamp(rfc3339: "2026-11-21T08:00:00Z")!
    static let sampleRecords: [Record] = [
        (0, .info, .network, "u-1002", "GET https://api.example.com/api/v2/cart -> 200 in 84 ms", ["http.status": 200, "duration_ms": 84]),
        (1_000_000, .warning, .player, "u-1002", "player buffering at 312s", ["track": "trk_1a2b3c"]),
        (2_500_000, .error, .business, "u-1002", "checkout failed: payment declined by issuer", ["order": "ORD-41872", "amount": 23.5]),
        (3_000_000, .notice, .app, "", "screen \"settings\" shown\twith a tab and é", [:]),
    ]

    /// A complete small upload: fixed records → store → per-day JSONL → zip → sealed chunks.
    @Test func completeUpload() throws {
        let request = Self.pullRequest("9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e", filter: LogFilter(uid: "u-1002"))
        let (file, produced) = try Self.uploadVector(
            "upload.json",
            description: "A complete pull upload of uid u-1002's records: per-day JSONL files and manifest.json in a zip (deflate level 6 in 512 KiB blocks; zip bytes depend on the zlib build, the files do not), sealed in 4096-byte chunks with the key and nonce prefix given.",
            records: Self.sampleRecords, base: Self.uploadBase, request: request)
        #expect(file == produced)
    }

    /// An empty selection: the zip holds only the manifest, which says so, and so does the header.
    @Test func emptyUpload() throws {
        let request = Self.pullRequest("6d1e2f3a4b5c6d7e8f9a0b1c2d3e4f50", filter: LogFilter(uid: "u-nobody"))
        let (file, produced) = try Self.uploadVector(
            "upload_empty.json",
            description: "A pull whose filter matches nothing: the zip holds only manifest.json (empty: true, record_count 0, days []), and the header has empty = true.",
            records: Self.sampleRecords, base: Self.uploadBase, request: request)
        #expect(file == produced)
    }

    /// A feedback upload: the header's feedback branch and a wrapped key (the feedback key under
    /// the test RSA key, which stands for the server's encryption key).
    @Test func feedbackUpload() throws {
        let key = try Self.testKey()
        let committed = Vectors.load("upload_feedback.json")
        var wrapped = unhex(committed?["header"].flatMap { ($0 as? [String: Any])?["wrapped_key"] })
        if (try? key.unwrapKey(wrapped)) == nil {
            wrapped = try key.publicKey.wrapKey(SymmetricKey(data: Self.aesKey))
        }
        #expect(try key.unwrapKey(wrapped) == SymmetricKey(data: Self.aesKey))
        let id = "5e0c1d2f3a4b5c6d7e8f90a1b2c3d4e5"
        let createdAt = Timestamp(rfc3339: "2026-11-21T00:00:01.000000Z")!
        let text = "The oven beeps twice and stops. Ça ne chauffe plus."
        let request = ExportRequest(
            uploadID: id, kind: .feedback, agentID: "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f",
            filter: LogFilter(since: createdAt.subtracting(.seconds(3 * 86_400)), until: createdAt.adding(.seconds(1)), uid: "u-1002"),
            feedback: ExportManifest.FeedbackDescription(feedbackID: id, uid: "u-1002", text: text, createdAt: createdAt.rfc3339), createdAt: createdAt)
        let (file, produced) = try Self.uploadVector(
            "upload_feedback.json",
            description: "A feedback upload: kind 2, the feedback branch of the canonical header, and wrapped_key = the feedback key (key) under keywrap.json's RSA key with RSA-OAEP-SHA256 (randomized: unwrap and compare). The manifest's filter is the feedback's uid over the 3 days before it, up to one second after.",
            records: Self.sampleRecords, base: Self.uploadBase, request: request, wrappedKey: wrapped,
            feedback: .with { $0.feedbackID = id; $0.uid = "u-1002"; $0.text = text; $0.createdAtUs = createdAt.microseconds })
        #expect(file == produced)
    }

    /// A day file over 512 KiB: its deflate stream is two blocks, the second primed with the last
    /// 32 KiB of the first as its dictionary; the zip is reproduced byte for byte by the Python check.
    @Test func multiBlockUpload() throws {
        var records: [Record] = []
        let levels: [LogLevel] = [.debug, .info, .notice, .warning, .error]
        let types: [LogType] = [.app, .network, .player, .business]
        for i in 0..<4_000 {
            let n = Int64(i)
            records.append((
                n * 5_000_000, levels[i % levels.count], types[i % types.count], "u-\(1000 + i % 7)",
                "event \(i): request \((i * 7_919) % 100_003) took \((i * 37) % 997) ms on shard \(i % 13)",
                ["seq": .int(n), "shard": .string("s-\(i % 13)"), "ok": .bool(i % 5 != 4)]
            ))
        }
        let request = Self.pullRequest("7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d", filter: .all)
        let (file, produced) = try Self.uploadVector(
            "upload_multiblock.json",
            description: "A pull upload whose one day file is over 512 KiB, so its deflate data is two blocks (§13, the exporter's zip): sealed in 16384-byte chunks. files_sha256: the SHA-256 of each file the zip holds.",
            records: records, base: Timestamp(rfc3339: "2026-11-20T00:00:00Z")!, request: request, chunkSize: 16_384, filesAsDigests: true)
        #expect(file == produced)
        let manifest = try #require(Vectors.load("upload_multiblock.json")?["manifest"] as? String)
        #expect(try JSONDecoder().decode(ExportManifest.self, from: Data(manifest.utf8)).days.contains { $0.bytes > 512 * 1024 })
    }

    /// #49: a day file of exactly 512 KiB (1,024 lines of 512 bytes): its deflate data is the
    /// first piece, ended with a sync flush, and an empty final piece primed with the last 32 KiB
    /// (Protocol § 13, the exporter's zip), reproduced byte for byte by the Python check.
    @Test func finalEmptyBlockUpload() throws {
        // A line is 116 bytes with an empty message (uid "u-1", type app, no metadata): 396 more make 512.
        let filler = "the quick brown fox jumps over the lazy dog; "
        let records: [Record] = (0..<1_024).map { i in
            let head = "event " + String(1_000 + i) + ": "
            let message = String((head + String(repeating: filler, count: 9)).prefix(396))
            return (Int64(i) * 40_000_000, .info, .app, "u-1", message, [:])
        }
        let request = Self.pullRequest("0e1f2a3b4c5d6e7f8091a2b3c4d5e6f7", filter: .all)
        let (file, produced) = try Self.uploadVector(
            "upload_final_block.json",
            description: "A pull upload whose one day file is exactly 524,288 bytes (512 KiB): its deflate data is one piece ended with Z_SYNC_FLUSH and an empty final piece (Z_FINISH, primed with the last 32 KiB) (§13, the exporter's zip); sealed in 16384-byte chunks. files_sha256: the SHA-256 of each file the zip holds.",
            records: records, base: Timestamp(rfc3339: "2026-11-20T00:00:00Z")!, request: request, chunkSize: 16_384, filesAsDigests: true)
        #expect(file == produced)
        let manifest = try #require(Vectors.load("upload_final_block.json")?["manifest"] as? String)
        #expect(try JSONDecoder().decode(ExportManifest.self, from: Data(manifest.utf8)).days.map(\.bytes) == [512 * 1024])
    }
}
