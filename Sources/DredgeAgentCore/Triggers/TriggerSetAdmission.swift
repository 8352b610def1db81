import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// The agent's checks on a trigger set (Protocol/README.md § 21, *The set*), in the specified
/// order, each failure with its reason: unsigned → bad signature → not for this agent → issue
/// time out of range (invalid) → issued in the future beyond CLOCK_SKEW, or before the set held
/// (expired: a replayed older set never undoes a newer one) → the terms (invalid).
public enum TriggerSetAdmission {
    public enum Decision: Sendable, Equatable {
        /// Hold it: its triggers, checked, in the order listed.
        case hold([TriggerRule])
        case reject(WireRejectReason, String)

        /// The answer (`TriggerSetAck`): the set's version and issue time, and the reason when refused.
        public func ack(for set: WireTriggerSet) -> WireFrame {
            .with {
                $0.triggerSetAck = .with { ack in
                    ack.version = set.version
                    ack.issuedAtUs = set.issuedAtUs
                    if case .reject(let reason, let detail) = self {
                        ack.reason = reason
                        ack.detail = detail
                    }
                }
            }
        }
    }

    /// Decides on `set`. `heldIssuedAtUs`: the issue time of the set the agent holds (nil: none).
    public static func admit(_ set: WireTriggerSet, agentID: String, serverKeys: PinnedServerKeys, heldIssuedAtUs: Int64?, now: Timestamp = .now) -> Decision {
        guard !set.signature.isEmpty else { return .reject(.rejectUnsigned, "the trigger set carries no signature") }
        guard serverKeys.verifiers(at: now).contains(where: { $0.isValid(set) }) else {
            return .reject(.rejectBadSignature, "the trigger set's signature does not verify under the pinned server key")
        }
        guard set.agentID == agentID else { return .reject(.rejectNotForMe, "the trigger set is for agent \(WireID.echo(set.agentID))") }
        guard Timestamp.acceptedRange.contains(set.issuedAtUs) else { return .reject(.rejectInvalid, "issued_at_us is outside 1970–9999") }
        if set.issuedAtUs > now.microseconds + WireLimits.clockSkewMicroseconds {
            return .reject(.rejectExpired, "issued at \(Timestamp(microseconds: set.issuedAtUs)), in the future")
        }
        if let held = heldIssuedAtUs, set.issuedAtUs < held {
            return .reject(.rejectExpired, "issued at \(Timestamp(microseconds: set.issuedAtUs)), before the set held (\(Timestamp(microseconds: held)))")
        }
        do {
            return .hold(try TriggerSetTerms.check(set))
        } catch {
            return .reject(.rejectInvalid, error.description)
        }
    }
}
