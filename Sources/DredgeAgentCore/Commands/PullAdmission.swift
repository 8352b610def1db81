import Crypto
import DredgeEnvelope
import DredgeDomain
import DredgeWire
import Foundation

/// The agent's checks on a pull command before it runs it (Protocol/README.md § Pull commands),
/// in the specified order, each failure with its distinct reason:
/// unsigned → bad signature → malformed id or times (invalid) → expired → replayed → not for
/// this agent → bad key → invalid (filter, uid).
///
/// A value: it remembers the ids of commands it has let past the signature and expiry checks,
/// with its answer, until they expire (``seen``), which the agent persists across restarts. A
/// command it has seen before is not admitted again: ``Decision/repeated(_:)`` carries the first
/// answer, which the agent gives again (a server redelivers a command whose answer it never got).
public struct PullAdmission: Sendable {
    public struct Accepted: Sendable {
        public var commandID: String
        public var filter: LogFilter
        public var key: SymmetricKey
        public var expiresAt: Timestamp
        /// Marked urgent by the engineer (§ 22): the device's upload policy may let it by.
        public var urgent: Bool

        public init(commandID: String, filter: LogFilter, key: SymmetricKey, expiresAt: Timestamp, urgent: Bool = false) {
            self.urgent = urgent
            self.commandID = commandID
            self.filter = filter
            self.key = key
            self.expiresAt = expiresAt
        }
    }

    public enum Decision: Sendable {
        case accept(Accepted)
        case reject(WireRejectReason, String)
        /// A command seen before (within its expiry), with the answer it was given then.
        case repeated(Remembered)

        /// The frame that answers the command.
        public func frame(commandID: String) -> WireFrame {
            let accepted = WireFrame.with { $0.commandAccepted = .with { $0.commandID = commandID; $0.uploadID = commandID } }
            switch self {
            case .accept:
                return accepted
            case .reject(let reason, let detail):
                return Self.rejection(commandID, reason, detail)
            case .repeated(let remembered):
                switch remembered.answer {
                case .accepted?: return accepted
                case .rejected(let reason, let detail)?: return Self.rejection(commandID, WireRejectReason(rawValue: reason) ?? .rejectInvalid, detail)
                case .failed(let detail)?: return Self.failure(commandID, detail)
                case nil: return Self.rejection(commandID, .rejectReplayed, "command \(commandID) was already received")
                }
            }
        }

        /// The report of an accepted command that could not be carried out (§ Pull commands).
        public static func failure(_ commandID: String, _ detail: String) -> WireFrame {
            .with { $0.error = .with { $0.code = .errorInternal; $0.detail = detail; $0.fatal = false; $0.uploadID = commandID } }
        }

        static func rejection(_ commandID: String, _ reason: WireRejectReason, _ detail: String) -> WireFrame {
            .with { $0.commandRejected = .with { $0.commandID = WireID.echo(commandID); $0.reason = reason; $0.detail = detail } }
        }
    }

    /// What the agent remembers of a command it has seen: until when, and how it answered.
    public struct Remembered: Codable, Sendable, Equatable {
        public enum Answer: Codable, Sendable, Equatable {
            case accepted
            case rejected(reason: Int, detail: String)
            /// Accepted, then given up here (its export failed, say): reported again.
            case failed(detail: String)
        }

        /// Until when (µs) the id is remembered: the command's expiry.
        public var expiresAtUs: Int64
        /// Nil for an id remembered without its answer (the memory of an older agent); such a
        /// command is answered `REJECT_REPLAYED`.
        public var answer: Answer?

        public init(expiresAtUs: Int64, answer: Answer?) {
            self.expiresAtUs = expiresAtUs
            self.answer = answer
        }

        /// Also reads the older form, a bare expiry.
        public init(from decoder: any Decoder) throws {
            if let expiry = try? decoder.singleValueContainer().decode(Int64.self) {
                self.init(expiresAtUs: expiry, answer: nil)
                return
            }
            let c = try decoder.container(keyedBy: CodingKeys.self)
            self.init(expiresAtUs: try c.decode(Int64.self, forKey: .expiresAtUs), answer: try c.decodeIfPresent(Answer.self, forKey: .answer))
        }
    }

    public let agentID: String
    /// The server keys the agent pins; a command may be signed by any not retired.
    public var serverKeys: PinnedServerKeys?
    private let verifier: CommandVerifier
    private let agentKey: RSAPrivateKey
    /// Command ids seen, with their expiry and answer.
    public private(set) var seen: [String: Remembered]

    public init(agentID: String, serverKey: CommandVerifier, agentKey: RSAPrivateKey, seen: [String: Remembered] = [:]) {
        self.agentID = agentID
        self.verifier = serverKey
        self.serverKeys = nil
        self.agentKey = agentKey
        self.seen = seen
    }

    /// An admission that takes commands signed by any of `serverKeys`' keys not retired.
    public init(agentID: String, serverKeys: PinnedServerKeys, agentKey: RSAPrivateKey, seen: [String: Remembered] = [:]) {
        self.init(agentID: agentID, serverKey: serverKeys.signing, agentKey: agentKey, seen: seen)
        self.serverKeys = serverKeys
    }

    /// Records that an accepted command failed here, so a redelivery of it is answered with the
    /// failure. `until` is used when the id is not remembered already.
    public mutating func rememberFailure(_ commandID: String, _ detail: String, until: Int64) {
        seen[commandID] = Remembered(expiresAtUs: seen[commandID]?.expiresAtUs ?? until, answer: .failed(detail: detail))
    }

    /// Decides on a command. `busy`: the agent has no room for another export now; a command
    /// that passes every other check is then answered `REJECT_BUSY` and not remembered, so a
    /// later delivery of it is decided afresh.
    public mutating func admit(_ command: WirePullCommand, now: Timestamp = .now, busy: Bool = false) -> Decision {
        seen = seen.filter { $0.value.expiresAtUs > now.microseconds }
        do {
            let verifiers = serverKeys?.verifiers(at: now) ?? [verifier]
            do {
                try verifiers[0].verify(command)
            } catch {
                // An earlier generation's key, not retired yet, may sign it; else the current
                // key's verdict (unsigned, bad signature).
                guard verifiers.dropFirst().contains(where: { $0.isValid(command) }) else { throw error }
            }
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
        if let remembered = seen[command.commandID] {
            return .repeated(remembered)
        }
        let decision = decide(command)
        if case .accept = decision, busy {
            return .reject(.rejectBusy, "the agent is running as many exports as it may; ask again later")
        }
        let answer: Remembered.Answer = switch decision {
        case .reject(let reason, let detail): .rejected(reason: reason.rawValue, detail: detail)
        case .accept, .repeated: .accepted
        }
        seen[command.commandID] = Remembered(expiresAtUs: command.expiresAtUs, answer: answer)
        return decision
    }

    /// Takes over what `evaluated` (the copy `trial` of this admission, after it admitted
    /// `commandID` elsewhere) came to remember of that command, and forgets what has expired:
    /// the admission's checks run off the agent's actor on a copy, and only their outcome comes
    /// back. What the copy did not change is left as it is here (a failure learned meanwhile
    /// stays).
    public mutating func remember(_ commandID: String, from evaluated: PullAdmission, before trial: PullAdmission, now: Timestamp = .now) {
        seen = seen.filter { $0.value.expiresAtUs > now.microseconds }
        if let remembered = evaluated.seen[commandID], remembered != trial.seen[commandID] { seen[commandID] = remembered }
    }

    /// The records a command selects: its filter, bounded by the signed target uid, whatever
    /// the filter says (a pull for one user never yields another's records). Throws for a
    /// filter the store cannot mean or a filter uid other than the target's. Used on admission
    /// and again when a saved command is resumed.
    public static func filter(of command: WirePullCommand) throws -> LogFilter {
        var filter = try LogFilter(wire: command.filter)
        if !command.target.uid.isEmpty {
            if let problem = UserID.problem(command.target.uid) { throw LogFilter.InvalidFilter(description: "target: \(problem)") }
            if let uid = filter.uid, uid != command.target.uid { throw LogFilter.InvalidFilter(description: "the filter's uid is not the target's uid") }
            filter.uid = command.target.uid
        }
        return filter
    }

    /// The checks after the id is remembered.
    private func decide(_ command: WirePullCommand) -> Decision {
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
            let filter = try Self.filter(of: command)
            return .accept(Accepted(commandID: command.commandID, filter: filter, key: key, expiresAt: Timestamp(microseconds: command.expiresAtUs), urgent: command.urgent))
        } catch {
            return .reject(.rejectInvalid, "\(error)")
        }
    }
}
