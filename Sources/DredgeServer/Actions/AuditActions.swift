import DredgeAdminAPI
import DredgeDomain
import Foundation

/// Reading the audit log, for both surfaces: the query read from the fields of a query string
/// (`since`, `actor`, `action`, `before`, `limit`) with one set of rules, then run.
extension AdminActions {
    /// The entries `fields` ask for, newest first, and the query they were read as (to page on
    /// with `before`). A field that is empty or only spaces is not given; `limit` is
    /// `defaultLimit` unless given.
    public func audit(_ fields: [String: String], defaultLimit: Int) async throws -> (query: AuditQuery, entries: [AuditEntry]) {
        let query = try Self.auditQuery(fields, defaultLimit: defaultLimit)
        return (query, try await services.audit.audit(query))
    }

    /// The audit log's hash chain, checked from its first entry (``AuditChain``).
    public func verifyAudit() async throws -> AuditVerification {
        let verdict = try await services.audit.verifyChain()
        if let broken = verdict.broken {
            logger.error("audit log chain broken", metadata: ["entry": "\(verdict.brokenAt ?? 0)", "why": "\(broken)"])
        }
        return verdict
    }

    static func auditQuery(_ fields: [String: String], defaultLimit: Int) throws -> AuditQuery {
        func given(_ name: String) -> String? {
            guard let value = fields[name]?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
            return value
        }
        var query = AuditQuery(actor: given("actor"), action: given("action"), limit: defaultLimit)
        if let limit = given("limit") {
            guard let n = Int(limit), (1...10_000).contains(n) else { throw ActionError(.invalid, "limit is 1 to 10000") }
            query.limit = n
        }
        if let since = given("since") {
            guard let micros = Int64(since), Timestamp(microseconds: micros).isAccepted else { throw ActionError(.invalid, "since is µs since 1970 (up to 9999)") }
            query.since = Timestamp(microseconds: micros).date
        }
        if let before = given("before") {
            guard let id = Int64(before), id > 0 else { throw ActionError(.invalid, "before is an entry's id, a positive number") }
            query.before = id
        }
        return query
    }
}
