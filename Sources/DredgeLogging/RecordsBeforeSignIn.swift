import DredgeDomain
import DredgeStore

/// What happens, when a user signs in (``LogCenter/setUser(_:)``), to the records logged
/// without a user just before: launch, restore, the sign-in attempts themselves. A pull by uid
/// selects records by their uid, so records left anonymous are invisible to it.
///
/// The records given the uid are the anonymous stretch directly before the sign-in: back to the
/// newest record that already carries a user, no further back than the window, at most
/// ``SignInAttribution/maxRecords`` (the newest). Each is marked with the metadata key
/// `dredge.before_sign_in` (``LogStore/beforeSignInKey``) set to `true`, so a reader can tell
/// them from the records logged while signed in.
public enum RecordsBeforeSignIn: Sendable, Equatable {
    /// The records logged since this center was opened with its context (this process run;
    /// centers of one process with equal contexts share one). The default.
    case processRun
    /// The records of this app on this host logged within `window` before the sign-in, from
    /// this run and earlier ones (such as a run that crashed before anyone signed in).
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
            guard window >= .zero else { return nil }
            return SignInAttribution(uid: uid, scope: .app(of: context), from: now.subtracting(window), through: now)
        }
    }
}
