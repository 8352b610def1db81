import DredgeDomain
import DredgeStore

/// What happens, when a user signs in (``LogCenter/setUser(_:)``), to the records logged
/// without a user just before: launch, restore, the sign-in attempts themselves. A pull by uid
/// selects records by their uid, so records left anonymous are invisible to it.
///
/// The records given the uid are the anonymous stretch directly before the sign-in: back to the
/// newest record that already carries a user, and no further back than the window. Each is
/// marked with the metadata key `dredge.before_sign_in` (``LogStore/beforeSignInKey``) set to
/// `true`, so a reader can tell them from the records logged while signed in.
public enum RecordsBeforeSignIn: Sendable, Equatable {
    /// The records this center logged since it was opened: this process run. The default.
    case processRun
    /// The records of this app on this host (this run and earlier ones, such as a run that
    /// crashed before anyone signed in) logged within `window` before the sign-in.
    case within(Duration)
    /// Records logged before a sign-in stay anonymous.
    case none
}

extension LogCenter {
    /// The attribution a sign-in at `now` asks the store for, or nil.
    static func attribution(
        of rule: RecordsBeforeSignIn, uid: String, context: ContextID, opened: Timestamp, now: Timestamp
    ) -> SignInAttribution? {
        switch rule {
        case .none:
            return nil
        case .processRun:
            return SignInAttribution(uid: uid, scope: .context(context), from: opened, through: now)
        case .within(let window):
            let (seconds, attoseconds) = window.components
            guard seconds >= 0, attoseconds >= 0 else { return nil }
            // Microseconds, saturating: a window longer than the clock's range reaches back to its start.
            let micros = seconds.multipliedReportingOverflow(by: 1_000_000)
            let width = micros.overflow ? Int64.max : micros.partialValue &+ min(attoseconds / 1_000_000_000_000, Int64.max - micros.partialValue)
            let from = now.microseconds.subtractingReportingOverflow(width)
            return SignInAttribution(
                uid: uid, scope: .app(of: context), from: Timestamp(microseconds: from.overflow ? Int64.min : from.partialValue), through: now)
        }
    }
}
