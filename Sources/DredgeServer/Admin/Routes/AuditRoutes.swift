import DredgeAdminAPI
import Hummingbird

/// `GET /v1/audit`: the audit log, newest first (`since`, `actor`, `action`, `before`,
/// `limit`; ``AdminActions/audit(_:defaultLimit:)``).
enum AuditRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, _ in
            var fields: [String: String] = [:]
            for (name, value) in request.uri.queryParameters where fields[String(name)] == nil { fields[String(name)] = String(value) }
            return try AdminAPI.json(await actions.audit(fields, defaultLimit: AuditQuery().limit).entries)
        }
        routes.get("verify") { _, _ in
            try AdminAPI.json(await actions.verifyAudit())
        }
        return routes
    }
}
