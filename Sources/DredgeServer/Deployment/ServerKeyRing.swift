import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeWire
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// The server's command-signing and encryption keys, by generation (README § Key rotation).
///
/// A fresh deployment has generation 1: `signing-key` and `encryption-key.pem`. A rotation
/// (``rotate(directory:overlap:now:)``) makes the next generation, announced to agents signed
/// by the current signing key, and gives the current one a retirement time (the end of the
/// overlap). Until then both are live: commands to an agent are signed with the key of the
/// generation it pins, and feedback keys and stored pull keys unwrap under any live
/// encryption key. From its retirement a generation is used for nothing, and the next write of
/// the ring forgets its private keys.
///
/// On disk, once rotated, `keyring.json` (0600) holds every live generation and is the one
/// that counts; `signing-key` and `encryption-key.pem` are rewritten to the current
/// generation after it, so that tools and backups that read them see the keys in use.
public struct KeyGeneration: Sendable {
    public let number: Int
    public let signingKey: ServerSigningKey
    public let encryptionKey: RSAPrivateKey
    /// The announcement that introduced it; nil for the first generation of a deployment.
    public let announcement: WireKeyAnnouncement?
    /// When it stops being used and accepted; nil while it is the current one.
    public let retiresAt: Date?

    func isLive(at now: Date) -> Bool { retiresAt.map { now < $0 } ?? true }

    /// The Ed25519 public key agents pin, hex.
    public var signingKeyHex: String { Hex.encode(signingKey.verifyingKey.rawRepresentation) }
    /// SHA-256 of the encryption key's SubjectPublicKeyInfo, hex.
    public var encryptionKeyFingerprint: String { Hex.encode(SHA256.hash(data: encryptionKey.publicKey.spki)) }
}

public enum ServerKeyRing {
    public static let file = "keyring.json"
    public static let lock = "keyring.lock"
    /// How long both generations stay live after a rotation, unless told otherwise.
    public static let defaultOverlap: Duration = .seconds(30 * 86_400)

    private struct Stored: Codable {
        struct Generation: Codable {
            var generation: Int
            /// The Ed25519 seed, hex.
            var signingKey: String
            var encryptionKey: String
            /// The announcement's protobuf bytes, base64.
            var announcement: String?
            var retiresAt: Date?
        }
        var format: Int
        var generations: [Generation]
    }

    /// Every generation the directory holds, oldest first, retired ones included until the
    /// ring is written again.
    public static func read(directory: String) throws -> [KeyGeneration] {
        let path = directory + "/" + file
        guard let data = FileManager.default.contents(atPath: path) else { return [try legacy(directory: directory)] }
        let stored: Stored
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .iso8601
            stored = try decoder.decode(Stored.self, from: data)
        } catch {
            throw DeploymentError("\(path) is damaged: \(error)")
        }
        guard stored.format == 1 else { throw DeploymentError("\(path) has format \(stored.format); this release reads format 1") }
        var generations: [KeyGeneration] = []
        for g in stored.generations {
            guard let seed = Hex.decode(g.signingKey) else { throw DeploymentError("\(path): generation \(g.generation)'s signing key is not hex") }
            var announcement: WireKeyAnnouncement?
            if let text = g.announcement {
                guard let bytes = Data(base64Encoded: text), let parsed = try? WireKeyAnnouncement(serializedBytes: bytes) else {
                    throw DeploymentError("\(path): generation \(g.generation)'s announcement is damaged")
                }
                announcement = parsed
            }
            generations.append(
                KeyGeneration(
                    number: g.generation, signingKey: try ServerSigningKey(rawRepresentation: seed),
                    encryptionKey: try RSAPrivateKey(pemRepresentation: g.encryptionKey), announcement: announcement, retiresAt: g.retiresAt))
        }
        generations.sort { $0.number < $1.number }
        guard let first = generations.first, let last = generations.last, last.retiresAt == nil, first.number >= 1, last.number < Int(UInt32.max),
            zip(generations, generations.dropFirst()).allSatisfy({ $0.number + 1 == $1.number && $0.retiresAt != nil })
        else { throw DeploymentError("\(path) does not hold consecutive generations ending with the current one") }
        return generations
    }

    /// Generation 1, from the files `init` writes.
    private static func legacy(directory: String) throws -> KeyGeneration {
        func read(_ name: String) throws -> String {
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw DeploymentError("\(directory)/\(name) is missing: run `dredge-server init --data \(directory)` first")
            }
            return String(decoding: data, as: UTF8.self)
        }
        guard let seed = Hex.decode(try read("signing-key").trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw DeploymentError("\(directory)/signing-key is not hex")
        }
        return KeyGeneration(
            number: 1, signingKey: try ServerSigningKey(rawRepresentation: seed), encryptionKey: try RSAPrivateKey(pemRepresentation: try read("encryption-key.pem")),
            announcement: nil, retiresAt: nil)
    }

    /// The longest overlap: ten years.
    public static let maxOverlap: Duration = .seconds(3_650 * 86_400)

    /// Makes the next generation and announces it, signed by the current signing key; the
    /// current one retires after `overlap`, and no earlier one later than that (a generation
    /// never outlives the one after it, so a short overlap after a leak retires every older
    /// key with it). Generations already retired at `now` are dropped. Nodes sharing the
    /// directory rotate one at a time (`keyring.lock`).
    @discardableResult
    public static func rotate(directory: String, overlap: Duration = defaultOverlap, now: Date = Date()) throws -> KeyGeneration {
        guard overlap > .zero, overlap <= maxOverlap else { throw DeploymentError("the overlap must be longer than zero and at most ten years") }
        return try ServerCertificate.holdingLock(directory, lock: lock) {
            let generations = try read(directory: directory)
            let current = generations[generations.count - 1]
            guard current.number < Int(UInt32.max) - 1 else { throw DeploymentError("generation \(current.number) is the last the protocol can number") }
            let retiresAt = now.addingTimeInterval(Double(overlap.components.seconds) + Double(overlap.components.attoseconds) / 1e18)
            let signing = ServerSigningKey.generate()
            let encryption = try RSAPrivateKey.generate()
            var announcement = WireKeyAnnouncement.with {
                $0.generation = UInt32(current.number + 1)
                $0.signingKey = Data(signing.verifyingKey.rawRepresentation)
                $0.encryptionKey = Data(encryption.publicKey.spki)
                $0.issuedAtUs = Timestamp(now).microseconds
                $0.previousRetiresAtUs = Timestamp(retiresAt).microseconds
            }
            try current.signingKey.sign(&announcement)
            let next = KeyGeneration(number: current.number + 1, signingKey: signing, encryptionKey: encryption, announcement: announcement, retiresAt: nil)
            let kept = generations.dropLast().drop { !$0.isLive(at: now) }.map { g in
                KeyGeneration(
                    number: g.number, signingKey: g.signingKey, encryptionKey: g.encryptionKey, announcement: g.announcement,
                    retiresAt: min(g.retiresAt ?? retiresAt, retiresAt))
            }
            let retired = KeyGeneration(
                number: current.number, signingKey: current.signingKey, encryptionKey: current.encryptionKey, announcement: current.announcement, retiresAt: retiresAt)
            try write(kept + [retired, next], directory: directory)
            return next
        }
    }

    /// Forgets the private keys of the generations retired at `now`, oldest first up to the
    /// first still live (the ring stays consecutive); the number forgotten.
    @discardableResult
    public static func dropRetired(directory: String, now: Date = Date()) throws -> Int {
        try ServerCertificate.holdingLock(directory, lock: lock) {
            let generations = try read(directory: directory)
            let kept = Array(generations.drop { !$0.isLive(at: now) })
            guard kept.count < generations.count else { return 0 }
            try write(kept, directory: directory)
            return generations.count - kept.count
        }
    }

    /// `keyring.json`, then the current generation's two files (each replaced durably).
    private static func write(_ generations: [KeyGeneration], directory: String) throws {
        let stored = Stored(
            format: 1,
            generations: try generations.map { g in
                Stored.Generation(
                    generation: g.number, signingKey: Hex.encode(g.signingKey.rawRepresentation), encryptionKey: g.encryptionKey.pemRepresentation,
                    announcement: try g.announcement.map { try $0.serializedData().base64EncodedString() }, retiresAt: g.retiresAt)
            })
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        try DurableFile.write(Array(try encoder.encode(stored)) + [10], to: directory + "/" + file, mode: 0o600)
        let current = generations[generations.count - 1]
        try DurableFile.write(Array((Hex.encode(current.signingKey.rawRepresentation) + "\n").utf8), to: directory + "/signing-key", mode: 0o600)
        try DurableFile.write(Array(current.encryptionKey.pemRepresentation.utf8), to: directory + "/encryption-key.pem", mode: 0o600)
    }
}

/// The key ring a running server uses: the generations it read, reloaded when `keyring.json`
/// changes (a rotation by the command, or by another node).
public final class KeyRing: Sendable {
    private struct State {
        var generations: [KeyGeneration]
        var stamp: FileStamp?
    }

    /// Where it was read from; nil for a ring made in memory (tests, tools).
    public let directory: String?
    private let state: Mutex<State>
    private let clock: @Sendable () -> Date

    public init(directory: String, now: @escaping @Sendable () -> Date = { Date() }) throws {
        self.directory = directory
        clock = now
        let stamp = FileStamp(directory + "/" + ServerKeyRing.file)
        state = Mutex(State(generations: try ServerKeyRing.read(directory: directory), stamp: stamp))
    }

    /// One generation, held in memory.
    public init(signingKey: ServerSigningKey, encryptionKey: RSAPrivateKey) {
        directory = nil
        clock = { Date() }
        state = Mutex(State(generations: [KeyGeneration(number: 1, signingKey: signingKey, encryptionKey: encryptionKey, announcement: nil, retiresAt: nil)]))
    }

    public var current: KeyGeneration { state.withLock { $0.generations[$0.generations.count - 1] } }

    /// Every generation read, retired ones included until the ring is written again; oldest first.
    public var all: [KeyGeneration] { state.withLock { $0.generations } }

    /// The live generations, newest first.
    public var live: [KeyGeneration] {
        let now = clock()
        return state.withLock { $0.generations.reversed().filter { $0.isLive(at: now) } }
    }

    /// Generation `number`, if it is live.
    public func generation(_ number: Int) -> KeyGeneration? {
        let now = clock()
        return state.withLock { s in s.generations.first { $0.number == number && $0.isLive(at: now) } }
    }

    /// Whether generation `number` is live; what every heartbeat asks, without copying anything.
    public func isLive(_ number: Int) -> Bool {
        let now = clock()
        return state.withLock { s in s.generations.contains { $0.number == number && $0.isLive(at: now) } }
    }

    /// The current generation's number.
    public var currentNumber: Int { state.withLock { $0.generations[$0.generations.count - 1].number } }

    /// The announcements that take an agent pinning `number` to the current generation,
    /// oldest first; empty when it is current (or unknown here).
    public func announcements(after number: Int) -> [WireKeyAnnouncement] {
        state.withLock { s in s.generations.filter { $0.number > number }.compactMap(\.announcement) }
    }

    /// A key wrapped under any live encryption key (RSA-OAEP tells a wrong key from the right
    /// one), the newest tried first.
    public func unwrapKey(_ wrapped: [UInt8]) throws -> SymmetricKey {
        var failure: (any Error)?
        for generation in live {
            do { return try generation.encryptionKey.unwrapKey(wrapped) } catch { failure = failure ?? error }
        }
        throw failure ?? DeploymentError("no live encryption key")
    }

    /// Reads the ring again if `keyring.json` changed since it was read. True when it did.
    @discardableResult
    public func reloadIfChanged() throws -> Bool {
        guard let directory else { return false }
        let stamp = FileStamp(directory + "/" + ServerKeyRing.file)
        guard stamp != state.withLock({ $0.stamp }) else { return false }
        let generations = try ServerKeyRing.read(directory: directory)
        state.withLock { $0 = State(generations: generations, stamp: stamp) }
        return true
    }
}

/// Keeps a running server's key ring as the directory has it: every `every` (10 s) it
/// reads `keyring.json` again if it changed (a rotation by `dredge-server keys rotate`, or by
/// another node), and forgets the private keys of generations that retired.
public final class KeyRingRefresh: Service, Sendable {
    let keys: KeyRing
    let every: Duration
    let now: @Sendable () -> Date
    let logger: Logger

    public init(keys: KeyRing, every: Duration = .seconds(10), now: @escaping @Sendable () -> Date = { Date() }, logger: Logger) {
        self.keys = keys
        self.every = every
        self.now = now
        self.logger = logger
    }

    /// One look.
    public func check() throws {
        if try keys.reloadIfChanged() {
            logger.notice("the server's keys changed on disk; using them", metadata: ["generation": "\(keys.current.number)"])
        }
        guard let directory = keys.directory else { return }
        let at = now()
        if keys.all.contains(where: { !$0.isLive(at: at) }), try ServerKeyRing.dropRetired(directory: directory, now: at) > 0 {
            try keys.reloadIfChanged()
            logger.notice("forgot the private keys of retired generations", metadata: ["oldest.kept": "\(keys.all.first?.number ?? 0)"])
        }
    }

    public func run() async throws {
        await Periodic.run(every: every, reportEvery: .seconds(3600), { try check() }) { error in
            logger.error("cannot read or tidy the server's key ring", metadata: ["error": "\(error)"])
        }
    }
}
