import DredgeAdminAPI
import DredgeDomain
import Hummingbird

/// `GET /v1/audit`: the audit log, newest first (`since`, `actor`, `action`, `before`, `limit`).
enum AuditRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, _ in
            let parameters = request.uri.queryParameters
            var query = AuditQuery()
            if let limit = parameters.get("limit") {
                guard let n = Int(limit), (1...10_000).contains(n) else { throw ActionError(.invalid, "limit is 1 to 10000") }
                query.limit = n
            }
            if let since = parameters.get("since") {
                guard let micros = Int64(since), Timestamp(microseconds: micros).isAccepted else { throw ActionError(.invalid, "since is µs since 1970 (up to 9999)") }
                query.since = Timestamp(microseconds: micros).date
            }
            // Empty means not given.
            query.actor = parameters.get("actor").flatMap { $0.isEmpty ? nil : String($0) }
            query.action = parameters.get("action").flatMap { $0.isEmpty ? nil : String($0) }
            if let before = parameters.get("before") {
                guard let id = Int64(before) else { throw ActionError(.invalid, "before is an entry's id") }
                query.before = id
            }
            return try AdminAPI.json(await actions.services.audit.audit(query))
        }
        return routes
    }
}
