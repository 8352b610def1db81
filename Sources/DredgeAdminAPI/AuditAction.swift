/// Every action the audit log records, by the name it is stored under and queried by
/// (`GET /v1/audit?action=`, `dredge audit --action`; a prefix before a dot finds the
/// actions under it: `token` finds `token.create` and `token.revoke`).
public enum AuditAction: String, Sendable, CaseIterable, Codable {
    /// A pull made (API, console or `dredge-server pull`).
    case pull
    /// A pull approved by a second person (#55): the approver, the requester and the reason.
    case pullApprove = "pull.approve"
    case pullDownload = "pull.download"
    case pullRemove = "pull.remove"
    /// A live tail started (#53): whose, which records, until when, how fast, why.
    case tail
    /// A live tail stopped, by a person or at its expiry: what it saw, from which devices.
    case tailStop = "tail.stop"
    /// What a live tail held downloaded (a device's records or contexts).
    case tailDownload = "tail.download"
    /// What a live tail held deleted (by a person, or the retention).
    case tailRemove = "tail.remove"
    /// A standing trigger defined (#54): what fires it, where, its window and budgets, why.
    case trigger
    /// A trigger disabled: devices stop matching it; its captures stay.
    case triggerDisable = "trigger.disable"
    /// A trigger removed: no longer listed, and captures of it are refused.
    case triggerRemove = "trigger.remove"
    /// What a capture holds downloaded (its files or its zip).
    case captureDownload = "capture.download"
    /// What a capture holds deleted (by a person, or the retention).
    case captureRemove = "capture.remove"
    case feedbackDownload = "feedback.download"
    case feedbackRemove = "feedback.remove"
    case recordsSearch = "records.search"
    case recordsRead = "records.read"
    case consoleSignIn = "console.sign-in"
    case consoleSignOut = "console.sign-out"
    case tokenCreate = "token.create"
    case tokenRevoke = "token.revoke"
    /// An agent revoked (a lost device, a decommissioned host).
    case agentRevoke = "agent.revoke"
    /// A refused admin token (actor `-`).
    case authFailed = "auth.failed"
    /// A request the caller's role may not make (#55): what was asked, and the role it needs.
    case accessDenied = "access.denied"

    /// What a filter by action offers (the console's audit page): each action, except that the
    /// `token.*` and `console.*` ones are offered as their group.
    public static var filters: [String] {
        var seen: [String] = []
        for action in allCases {
            let group = action.rawValue.split(separator: ".").first.map(String.init) ?? action.rawValue
            let name = ["token", "console"].contains(group) ? group : action.rawValue
            if !seen.contains(name) { seen.append(name) }
        }
        return seen
    }
}
