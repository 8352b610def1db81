import DredgeAdminAPI
import Foundation

/// Who is asking: an admin token's name, role and scope (or a console session's, which are its
/// token's). Every action that reads or changes what devices logged takes one; what it may do
/// is ``AdminOperation``'s table, what it may see is its ``scope``.
public struct Caller: Sendable, Equatable {
    /// What the audit log records the caller's actions under.
    public var name: String
    public var role: AdminRole
    public var scope: AccessScope
    /// When its token ends (nil: it does not).
    public var expiresAt: Date?

    public init(name: String, role: AdminRole, scope: AccessScope = .everything, expiresAt: Date? = nil) {
        self.name = name
        self.role = role
        self.scope = role == .admin ? .everything : scope
        self.expiresAt = expiresAt
    }

    /// An admin: every operation, every device (the server's own commands, tests).
    public static func admin(_ name: String) -> Caller { Caller(name: name, role: .admin) }

    public var info: CallerInfo { CallerInfo(name: name, role: role, scope: scope, expiresAt: expiresAt) }

    /// Whether the caller may touch this device: always for an unscoped caller.
    public func admits(_ agent: AgentRecord) -> Bool {
        scope.isEverything || scope.admits(app: agent.app, version: agent.appVersion, labels: agent.labels)
    }
}

/// Everything a caller can ask of the server, with the least role each needs: the one table
/// the admin API, the console and (through the API) the CLI check against, through
/// ``AdminActions/authorize(_:_:on:)``. A route or page that names no operation is refused
/// (default deny: ``AdminAPI``'s route table, the console's `checked`).
public enum AdminOperation: String, Sendable, CaseIterable {
    // Reading what was pulled already, within the scope.
    case listAgents = "list agents"
    case readPulls = "read pulls"
    case readTails = "read tails"
    case readTriggers = "read triggers"
    case readFeedback = "read feedback"
    case searchRecords = "search records"
    case readFiles = "download files"
    case whoami = "say who you are"
    // Asking devices for logs, within the scope.
    case createPull = "make a pull"
    case approvePull = "approve a pull"
    case createTail = "tail a user's devices"
    case watchTail = "watch a tail"
    case stopTail = "stop a tail"
    case createTrigger = "define a trigger"
    case disableTrigger = "disable or remove a trigger"
    // Running the deployment.
    case revokeAgent = "revoke an agent"
    case removeResults = "remove results"
    case readAudit = "read the audit log"
    case manageTokens = "manage tokens"

    /// The least role that may do it.
    public var leastRole: AdminRole {
        switch self {
        case .listAgents, .readPulls, .readTails, .readTriggers, .readFeedback, .searchRecords, .readFiles, .whoami: .reader
        case .createPull, .approvePull, .createTail, .watchTail, .stopTail, .createTrigger, .disableTrigger: .investigator
        case .revokeAgent, .removeResults, .readAudit, .manageTokens: .admin
        }
    }
}

extension AdminActions {
    /// Refuses `caller` unless its role may do `operation` (``AdminOperation/leastRole``): a
    /// refusal is ``ActionError/Kind/forbidden`` saying which role it needs, and is audited
    /// (`access.denied`, once per caller and operation in ten minutes, the rest counted).
    /// `target` says what was asked, for the audit entry (`POST /v1/pulls`, a console page).
    public func authorize(_ operation: AdminOperation, _ caller: Caller, on target: String) async throws {
        guard caller.role < operation.leastRole else { return }
        let message = "to \(operation.rawValue) needs the role \(operation.leastRole.rawValue); \(caller.name) is \(caller.role.rawValue)"
        logger.notice("access denied", metadata: ["by": "\(caller.name)", "operation": "\(operation.rawValue)", "target": "\(target)"])
        if let suppressed = deniedAudit.admit(caller.name + "\u{0}" + operation.rawValue, now: now()) {
            let detail = "\(target): \(message)" + (suppressed > 0 ? " (and \(suppressed) more refusals of this not recorded)" : "")
            try await services.audit.record(actor: caller.name, .accessDenied, detail: ConnectionUploads.bounded(detail))
        }
        throw ActionError(.forbidden, message, code: "forbidden")
    }

    /// The caller as the server sees it (`dredge whoami`).
    public func whoami(_ caller: Caller) -> CallerInfo { caller.info }

    /// The agents `caller` may touch, by id (nil: every agent).
    func scopedAgents(_ caller: Caller) async throws -> Set<String>? {
        guard !caller.scope.isEverything else { return nil }
        return Set(try await services.registry.agents().filter(caller.admits).map(\.agentID))
    }
}

/// Whether pulls of user logs need a second person's approval (#55; `approvals.required`).
public struct ApprovalSettings: Codable, Sendable, Equatable {
    public var required: Bool?

    public init(required: Bool? = nil) { self.required = required }

    public var isRequired: Bool { required ?? false }
}

extension RecordPage {
    /// What a search answers when the caller's scope leaves nothing to read.
    static var empty: RecordPage { RecordPage(records: [], next: nil, indexing: 0, newestID: 0) }
}

extension Caller {
    /// An admin token's row read back: its role and scope columns as kept; nil when it has
    /// expired at `now` (no `now`: not checked here).
    static func stored(name: String, role: String?, scope: String?, expiresAt: Double?, now: Date?) throws -> Caller? {
        let expires = expiresAt.map(Date.init(timeIntervalSince1970:))
        if let now, let expires, expires <= now { return nil }
        return Caller(
            name: name, role: try TokenLimits.role(role ?? AdminRole.admin.rawValue, token: name), scope: try AccessScope.stored(scope, of: "admin token \(name)") ?? .everything,
            expiresAt: expires)
    }

    /// Who the token row `name` signs in: its name, or for a token single sign-on made
    /// (`sso:` + the subject percent-encoded + `~` + a login id, ``TokenLimits/signedOnName(subject:)``)
    /// the person, `sso:SUBJECT`, as the console names them, so each of their logins is the
    /// same person to the audit log and to the two-person rule of approvals. Only token rows
    /// are read so (``TokenVault/admin(for:now:)``): a session keeps the name it was given.
    static func person(ofToken name: String) -> String {
        guard name.hasPrefix(SingleSignOn.namePrefix), let tilde = name.lastIndex(of: "~"),
            let subject = name[name.index(name.startIndex, offsetBy: SingleSignOn.namePrefix.count)..<tilde].removingPercentEncoding
        else { return name }
        return SingleSignOn.namePrefix + subject
    }
}
