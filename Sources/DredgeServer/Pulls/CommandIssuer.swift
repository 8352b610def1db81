import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Synchronization

/// The server's cryptography for pulls, kept out of storage: it makes each pull's AES key
/// (stored only wrapped under the server's encryption key), and turns a stored pull into the
/// signed command for one agent (the key rewrapped under that agent's public key).
///
/// The keys of the pulls made or delivered lately are kept in memory (``recentKeys``, at
/// most ``recentKeyCount``), so delivering a command usually costs no RSA private-key
/// operation: unwrapping took 1.5–3 ms of CPU on the path from `POST /v1/pulls` to the agent,
/// once per target agent. Copies of one issuer share them; the server makes one.
public struct CommandIssuer: Sendable {
    /// The server's keys by generation: new pulls' keys are wrapped under the current one, a
    /// stored key unwraps under any live one, and an agent's commands are signed with the
    /// generation it pins (README § Key rotation).
    public let keys: KeyRing
    let recentKeys: RecentKeys

    public static let recentKeyCount = 1_024

    public init(keys: KeyRing) {
        self.keys = keys
        recentKeys = RecentKeys(capacity: Self.recentKeyCount)
    }

    /// An issuer of one generation, held in memory.
    public init(encryptionKey: RSAPrivateKey, signingKey: ServerSigningKey) {
        self.init(keys: KeyRing(signingKey: signingKey, encryptionKey: encryptionKey))
    }

    /// A new pull with a fresh id and key, ready to queue.
    public func newPull(uid: String, agentID: String, filter: LogFilter, targets: [String], lifetime: Duration, requestedBy: String, now: Timestamp = .now) throws -> NewPull {
        let key = SymmetricKey.uploadKey()
        let wrapped = try keys.current.encryptionKey.publicKey.wrapKey(key)
        recentKeys.insert(key, for: wrapped)
        return NewPull(
            id: Hex.encode(secureRandomBytes(16)), uid: uid, agentID: agentID, filter: filter, issuedAt: now, expiresAt: now.adding(lifetime),
            wrappedKey: wrapped, requestedBy: requestedBy, targets: targets)
    }

    /// A pull's AES key, from its wrapped form (from memory when this issuer wrapped or
    /// unwrapped it lately).
    public func key(_ wrapped: [UInt8]) throws -> SymmetricKey {
        if let known = recentKeys.key(for: wrapped) { return known }
        let key = try keys.unwrapKey(wrapped)
        recentKeys.insert(key, for: wrapped)
        return key
    }

    /// The signed command of `pull` for `agent`, signed with the key of `keyGeneration` (the
    /// generation the agent pins; the current one when nil). Throws ``UnreadablePull`` when its
    /// key does not unwrap, or that generation is retired (the pull can never be sent to this
    /// agent); other errors are passing. An urgent pull's command says so only when
    /// `urgentAgreed` (the agent agreed `urgent` on its connection, Protocol § 22): otherwise
    /// it is signed as every command was before.
    public func command(_ pull: StoredPull, agent: String, agentKey: RSAPublicKey, keyGeneration: Int? = nil, urgentAgreed: Bool = false) throws -> WirePullCommand {
        let key: SymmetricKey
        do {
            key = try self.key(pull.wrappedKey)
        } catch {
            throw UnreadablePull("the key of pull \(pull.id) does not unwrap: \(error)")
        }
        guard let signing = keyGeneration.map({ keys.generation($0) }) ?? keys.current else {
            throw UnreadablePull("agent \(agent) pins generation \(keyGeneration ?? 0) of the server's keys, which is retired: enroll it again")
        }
        var command = WirePullCommand.with {
            $0.commandID = pull.id
            $0.target = .with { $0.uid = pull.uid; $0.agentID = agent }
            $0.filter = pull.filter.wire
            $0.issuedAtUs = pull.issuedAt.microseconds
            $0.expiresAtUs = pull.expiresAt.microseconds
            $0.urgent = pull.urgent && urgentAgreed
        }
        command.wrappedKey = Data(try agentKey.wrapKey(key))
        try signing.signingKey.sign(&command)
        return command
    }
}

extension CommandIssuer {
    /// A new live tail with a fresh id (#53): open from `now` for `lifetime`. Each device's part
    /// gets its own key when it is first delivered (``newTailKey()``).
    public func newTail(
        uid: String, agents: [String]?, filter: LogFilter, lifetime: Duration, recordsPerSecond: UInt32, bytesPerSecond: UInt64, verbose: Bool,
        verboseTypes: [String], requestedBy: String, reason: String, now: Timestamp = .now
    ) -> NewTail {
        var filter = filter
        filter.uid = uid
        filter.since = nil
        filter.until = nil
        return NewTail(
            id: Hex.encode(secureRandomBytes(16)), uid: uid, agents: agents, filter: filter, issuedAt: now, expiresAt: now.adding(lifetime),
            recordsPerSecond: recordsPerSecond, bytesPerSecond: bytesPerSecond, verbose: verbose, verboseTypes: verboseTypes.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) },
            requestedBy: requestedBy, reason: reason)
    }

    /// A fresh tail key for one device's part, wrapped under the server's current key (what the
    /// registry keeps).
    public func newTailKey() throws -> [UInt8] {
        let key = SymmetricKey.uploadKey()
        let wrapped = try keys.current.encryptionKey.publicKey.wrapKey(key)
        recentKeys.insert(key, for: wrapped)
        return wrapped
    }

    /// The signed `TailCommand` of `tail` for `agent`, with the part's key (`wrappedKey`, as the
    /// registry keeps it) rewrapped under the agent's key and signed with the generation the
    /// agent pins. Throws ``UnreadablePull`` when the key does not unwrap or the generation is
    /// retired (the tail can never be sent to this agent).
    /// An urgent tail's command says so only when `urgentAgreed` (Protocol § 22).
    public func tailCommand(_ tail: TailRecord, agent: String, agentKey: RSAPublicKey, wrappedKey: [UInt8], keyGeneration: Int? = nil, urgentAgreed: Bool = false) throws -> WireTailCommand {
        let key: SymmetricKey
        do {
            key = try self.key(wrappedKey)
        } catch {
            throw UnreadablePull("the key of tail \(tail.id) for agent \(agent) does not unwrap: \(error)")
        }
        guard let signing = keyGeneration.map({ keys.generation($0) }) ?? keys.current else {
            throw UnreadablePull("agent \(agent) pins generation \(keyGeneration ?? 0) of the server's keys, which is retired: enroll it again")
        }
        let filter = tail.filter.wire
        var command = WireTailCommand.with {
            $0.tailID = tail.id
            $0.target = .with { $0.uid = tail.uid; $0.agentID = agent }
            $0.filter = .with {
                if filter.hasUid { $0.uid = filter.uid }
                $0.types = filter.types
                $0.levels = filter.levels
                if filter.hasText { $0.text = filter.text }
            }
            $0.issuedAtUs = tail.issuedAt.microseconds
            $0.expiresAtUs = tail.expiresAt.microseconds
            $0.maxRecordsPerS = tail.recordsPerSecond
            $0.maxBytesPerS = tail.bytesPerSecond
            $0.verbose = tail.verbose
            $0.verboseTypes = tail.verboseTypes
            $0.urgent = tail.urgent == true && urgentAgreed
        }
        command.wrappedKey = Data(try agentKey.wrapKey(key))
        try signing.signingKey.sign(&command)
        return command
    }
}

/// Pull keys by their wrapped form, the most recent ``capacity`` kept (the oldest inserted
/// goes first). A wrapped form is random (RSA-OAEP), so it names one key of one server key.
final class RecentKeys: Sendable {
    private struct State {
        var keys: [[UInt8]: SymmetricKey] = [:]
        var order: [[UInt8]] = []
        var next = 0
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    var count: Int { state.withLock { $0.keys.count } }

    func key(for wrapped: [UInt8]) -> SymmetricKey? {
        state.withLock { $0.keys[wrapped] }
    }

    func insert(_ key: SymmetricKey, for wrapped: [UInt8]) {
        state.withLock { s in
            guard s.keys.updateValue(key, forKey: wrapped) == nil else { return }
            if s.order.count < capacity {
                s.order.append(wrapped)
            } else {
                s.keys[s.order[s.next]] = nil
                s.order[s.next] = wrapped
                s.next = (s.next + 1) % capacity
            }
        }
    }
}
