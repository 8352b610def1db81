import Crypto
import DredgeEnvelope
import DredgeStore
import DredgeWire
import Foundation

/// The agent's checks on a pull command before it runs it (Protocol/README.md § Pull commands),
/// in the specified order, each failure with its distinct reason:
/// unsigned → bad signature → malformed id or times (invalid) → expired → replayed → not for
/// this agent → bad key → invalid (filter, uid).
///
/// A value: it remembers the ids of commands it has let past the signature and expiry checks
/// until they expire (``seen``), which the agent persists across restarts.
public struct PullAdmission: Sendable {
    public struct Accepted: Sendable {
        public var commandID: String
        public var filter: LogFilter
        public var key: SymmetricKey
        public var expiresAt: Timestamp

        public init(commandID: String, filter: LogFilter, key: SymmetricKey, expiresAt: Timestamp) {
            self.commandID = commandID
            self.filter = filter
            self.key = key
            self.expiresAt = expiresAt
        }
    }

    public enum Decision: Sendable {
        case accept(Accepted)
        case reject(WireRejectReason, String)

        /// The frame that answers the command.
        public func frame(commandID: String) -> WireFrame {
            switch self {
            case .accept: return .with { $0.commandAccepted = .with { $0.commandID = commandID; $0.uploadID = commandID } }
            case .reject(let reason, let detail): return .with { $0.commandRejected = .with { $0.commandID = WireID.echo(commandID); $0.reason = reason; $0.detail = detail } }
            }
        }
    }

    public let agentID: String
    private let verifier: CommandVerifier
    private let agentKey: RSAPrivateKey
    /// Command ids seen, with the time (µs) until which they must be remembered.
    public private(set) var seen: [String: Int64]

    public init(agentID: String, serverKey: CommandVerifier, agentKey: RSAPrivateKey, seen: [String: Int64] = [:]) {
        self.agentID = agentID
        self.verifier = serverKey
        self.agentKey = agentKey
        self.seen = seen
    }

    public mutating func admit(_ command: WirePullCommand, now: Timestamp = .now) -> Decision {
        seen = seen.filter { $0.value > now.microseconds }
        do {
            try verifier.verify(command)
        } catch let error as EnvelopeError {
            return .reject(error.code == .unsigned ? .rejectUnsigned : .rejectBadSignature, error.message)
        } catch {
            return .reject(.rejectBadSignature, "\(error)")
        }
        // Times outside 1970–9999 are refused before anything is remembered or computed from
        // them (an expiry of Int64.max would be remembered forever).
        guard Timestamp.acceptedRange.contains(command.issuedAtUs), Timestamp.acceptedRange.contains(command.expiresAtUs) else {
            return .reject(.rejectInvalid, "issued_at_us or expires_at_us is outside 1970–9999")
        }
        guard WireID.isValid(command.commandID) else {
            return .reject(.rejectInvalid, "the command id is not 32 lowercase hex characters")
        }
        if now.microseconds >= command.expiresAtUs {
            return .reject(.rejectExpired, "expired at \(Timestamp(microseconds: command.expiresAtUs))")
        }
        if command.issuedAtUs > now.microseconds + WireLimits.clockSkewMicroseconds {
            return .reject(.rejectExpired, "issued at \(Timestamp(microseconds: command.issuedAtUs)), in the future")
        }
        if seen[command.commandID] != nil {
            return .reject(.rejectReplayed, "command \(command.commandID) was already received")
        }
        seen[command.commandID] = command.expiresAtUs
        if !command.target.agentID.isEmpty && command.target.agentID != agentID {
            return .reject(.rejectNotForMe, "command is for agent \(command.target.agentID)")
        }
        let key: SymmetricKey
        do {
            key = try agentKey.unwrapKey(command.wrappedKey)
        } catch {
            return .reject(.rejectBadKey, "the command key does not unwrap under this agent's key")
        }
        if !command.target.uid.isEmpty, let problem = UserID.problem(command.target.uid) {
            return .reject(.rejectInvalid, "target: \(problem)")
        }
        do {
            let filter = try LogFilter(wire: command.filter)
            return .accept(Accepted(commandID: command.commandID, filter: filter, key: key, expiresAt: Timestamp(microseconds: command.expiresAtUs)))
        } catch {
            return .reject(.rejectInvalid, "\(error)")
        }
    }
}

extension LogFilter {
    struct InvalidFilter: Error, CustomStringConvertible {
        var description: String
    }

    /// The store filter a pull's wire filter means; throws for values the store cannot mean
    /// (unknown levels, invalid type names, an empty time range).
    public init(wire f: WireFilter) throws {
        self.init()
        if f.hasSinceUs { since = Timestamp(microseconds: f.sinceUs) }
        if f.hasUntilUs { until = Timestamp(microseconds: f.untilUs) }
        if f.hasUid { uid = f.uid }
        if !f.types.isEmpty {
            types = Set(try f.types.map { name in
                guard let type = LogType(name) else { throw InvalidFilter(description: "invalid log type \(name.debugDescription)") }
                return type
            })
        }
        if !f.levels.isEmpty {
            levels = Set(try f.levels.map { level in
                guard let value = LogLevel(rawValue: level.rawValue) else { throw InvalidFilter(description: "unknown level \(level.rawValue)") }
                return value
            })
        }
        if f.hasText { text = f.text }
        if let problem { throw InvalidFilter(description: problem) }
    }

    /// The wire form of this filter, as the server puts it in a pull command.
    public var wire: WireFilter {
        WireFilter.with { f in
            if let since { f.sinceUs = since.microseconds }
            if let until { f.untilUs = until.microseconds }
            if let uid { f.uid = uid }
            if let types { f.types = types.map(\.rawValue).sorted() }
            if let levels { f.levels = levels.sorted().map { WireLevel(rawValue: $0.rawValue) ?? .info } }
            if let text { f.text = text }
        }
    }
}
