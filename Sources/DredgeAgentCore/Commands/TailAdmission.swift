import Crypto
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// The agent's checks on a tail command (Protocol/README.md § 20, Live tail), in the order of a
/// pull command's (§ 10), each failure with its reason: unsigned → bad signature → malformed id
/// or times → expired → not for this agent → bad key → invalid (no target uid, a filter uid
/// that is another's, a bad filter, too long, rates out of bounds) → busy (already running
/// ``WireLimits/maxTailsPerAgent`` others; a running tail delivered again is accepted again).
///
/// Nothing is remembered here: a tail the agent runs is in `running`, and a tail redelivered
/// after a restart is decided as the first time (the checks give the same answer) and resumes
/// from what the server holds.
public enum TailAdmission {
    /// A tail the agent may run: what it sends, how fast, until when, sealed under which key.
    public struct Accepted: Sendable {
        public var tailID: String
        public var uid: String
        /// The records it sends: its filter, bound to the target uid.
        public var filter: LogFilter
        public var key: SymmetricKey
        public var expiresAt: Timestamp
        public var recordsPerSecond: UInt32
        public var bytesPerSecond: UInt64
        /// Also keep the user's debug and trace records while it runs (of `verboseTypes` only,
        /// when not empty).
        public var verbose: Bool
        public var verboseTypes: Set<LogType>
        /// Marked urgent by the engineer (§ 22): the device's upload policy may let it by.
        public var urgent: Bool = false
    }

    public enum Decision: Sendable {
        case accept(Accepted)
        case reject(WireRejectReason, String)

        /// The frame that answers the command (`startCursor`: where in the store the tail began).
        public func frame(tailID: String, startCursor: UInt64) -> WireFrame {
            switch self {
            case .accept: .with { $0.tailAccepted = .with { $0.tailID = tailID; $0.startCursor = startCursor } }
            case .reject(let reason, let detail): .with { $0.commandRejected = .with { $0.commandID = WireID.echo(tailID); $0.reason = reason; $0.detail = detail } }
            }
        }
    }

    /// Decides on `command`. `running`: the tails the agent runs now (one of them delivered
    /// again is accepted again, and not counted twice).
    public static func admit(
        _ command: WireTailCommand, agentID: String, serverKeys: PinnedServerKeys, agentKey: RSAPrivateKey, running: Set<String>, now: Timestamp = .now
    ) -> Decision {
        guard !command.signature.isEmpty else { return .reject(.rejectUnsigned, "tail \(WireID.echo(command.tailID)) carries no signature") }
        guard serverKeys.verifiers(at: now).contains(where: { $0.isValid(command) }) else {
            return .reject(.rejectBadSignature, "tail \(WireID.echo(command.tailID)) signature does not verify under the pinned server key")
        }
        guard Timestamp.acceptedRange.contains(command.issuedAtUs), Timestamp.acceptedRange.contains(command.expiresAtUs) else {
            return .reject(.rejectInvalid, "issued_at_us or expires_at_us is outside 1970–9999")
        }
        guard WireID.isValid(command.tailID) else { return .reject(.rejectInvalid, "the tail id is not 32 lowercase hex characters") }
        if now.microseconds >= command.expiresAtUs { return .reject(.rejectExpired, "expired at \(Timestamp(microseconds: command.expiresAtUs))") }
        if command.issuedAtUs > now.microseconds + WireLimits.clockSkewMicroseconds {
            return .reject(.rejectExpired, "issued at \(Timestamp(microseconds: command.issuedAtUs)), in the future")
        }
        if !command.target.agentID.isEmpty && command.target.agentID != agentID {
            return .reject(.rejectNotForMe, "tail is for agent \(command.target.agentID)")
        }
        let key: SymmetricKey
        do {
            key = try agentKey.unwrapKey(command.wrappedKey)
        } catch {
            return .reject(.rejectBadKey, "the tail key does not unwrap under this agent's key")
        }
        let accepted: Accepted
        do {
            accepted = try Self.accepted(command, key: key)
        } catch {
            return .reject(.rejectInvalid, "\(error)")
        }
        if !running.contains(command.tailID) && running.count >= WireLimits.maxTailsPerAgent {
            return .reject(.rejectBusy, "the agent runs as many tails as it may (\(WireLimits.maxTailsPerAgent)); stop one or ask again later")
        }
        return .accept(accepted)
    }

    /// The command's terms, checked: one user's records (the filter bound to the target uid),
    /// for at most an hour, at rates within the protocol's bounds.
    static func accepted(_ command: WireTailCommand, key: SymmetricKey) throws -> Accepted {
        struct Invalid: Error, CustomStringConvertible { let description: String }
        let uid = command.target.uid
        guard !uid.isEmpty else { throw Invalid(description: "a tail names its user (target.uid)") }
        if let problem = UserID.problem(uid) { throw Invalid(description: "target: \(problem)") }
        let f = command.filter
        var filter = try LogFilter(wire: .with {
            if f.hasUid { $0.uid = f.uid }
            $0.types = f.types
            $0.levels = f.levels
            if f.hasText { $0.text = f.text }
        })
        if let other = filter.uid, other != uid { throw Invalid(description: "the filter's uid is not the target's uid") }
        filter.uid = uid
        let duration = command.expiresAtUs - command.issuedAtUs
        guard duration > 0, duration <= WireLimits.maxTailDurationMicroseconds else {
            throw Invalid(description: "a tail lasts at most an hour and expires after it is issued")
        }
        guard WireLimits.tailRecordRate.contains(command.maxRecordsPerS), WireLimits.tailByteRate.contains(command.maxBytesPerS) else {
            throw Invalid(description: "rates outside \(WireLimits.tailRecordRate) records/s and \(WireLimits.tailByteRate) bytes/s")
        }
        var verboseTypes = Set<LogType>()
        for name in command.verboseTypes {
            guard let type = LogType(name) else { throw Invalid(description: "verbose type '\(name.prefix(64))' is not a type name") }
            verboseTypes.insert(type)
        }
        return Accepted(
            tailID: command.tailID, uid: uid, filter: filter, key: key, expiresAt: Timestamp(microseconds: command.expiresAtUs),
            recordsPerSecond: command.maxRecordsPerS, bytesPerSecond: command.maxBytesPerS, verbose: command.verbose, verboseTypes: verboseTypes,
            urgent: command.urgent)
    }
}
