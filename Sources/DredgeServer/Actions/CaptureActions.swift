import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation

/// What standing triggers brought in (#54): a trigger's captures grouped under it, one capture,
/// its files, its removal. A caller reads a capture when it may read its trigger (an unscoped
/// caller: any; a scoped one: its own triggers, whose captures come from its devices only).
extension AdminActions {
    private func captureRegistry() throws -> any TriggerRegistry {
        guard let triggers = services.triggers else { throw ActionError(.unavailable, "this server keeps no triggers") }
        return triggers
    }

    /// A trigger, the devices that hold it, its captures of the last day and its newest
    /// captures (at most `limit`).
    public func activity(ofTrigger id: String, limit: Int, for caller: Caller) async throws -> TriggerActivity {
        let trigger = try await self.trigger(id, for: caller)
        let registry = try captureRegistry()
        async let holders = registry.holders(of: trigger.id)
        async let lastDay = registry.tally(of: trigger.id, since: now().addingTimeInterval(-86_400))
        let captures = try await registry.captures(of: trigger.id, limit: min(max(limit, 1), Self.maximumListing))
        return TriggerActivity(trigger: trigger, holders: try await holders, lastDay: try await lastDay, captures: captures)
    }

    /// The newest captures of every trigger the caller may read.
    public func captures(limit: Int, for caller: Caller) async throws -> [CaptureRecord] {
        let limit = min(max(limit, 1), Self.maximumListing)
        let registry = try captureRegistry()
        guard !caller.scope.isEverything else { return try await registry.captures(of: nil, limit: limit) }
        var listed: [CaptureRecord] = []
        for trigger in try await triggers(limit: Self.maximumListing, for: caller) {
            listed += try await registry.captures(of: trigger.id, limit: limit)
        }
        return Array(listed.sorted { ($0.receivedAt, $0.id) > ($1.receivedAt, $1.id) }.prefix(limit))
    }

    /// One capture the caller may read; otherwise not found.
    public func capture(_ id: String, for caller: Caller) async throws -> CaptureRecord {
        let id = try Self.checkedID(id, "capture")
        guard let capture = try await captureRegistry().capture(id) else { throw ActionError(.notFound, "no capture \(id)") }
        if !caller.scope.isEverything {
            do {
                _ = try await trigger(capture.triggerID, for: caller)
            } catch let error as ActionError where error.kind == .notFound {
                throw ActionError(.notFound, "no capture \(id)")
            }
        }
        return capture
    }

    /// A capture's files (its per-day files, manifest and zip), once complete.
    public func files(ofCapture id: String, for caller: Caller) async throws -> [PullFiles.Located] {
        let capture = try await self.capture(id, for: caller)
        return try await servedFiles().list(capture: capture.id) ?? []
    }

    public func file(ofCapture id: String, name: String, for caller: Caller) async throws -> Download {
        let capture = try await self.capture(id, for: caller)
        guard let located = try await servedFiles().locate(capture: capture.id, name: name) else {
            throw ActionError(.notFound, "capture \(capture.id) has no file \(WireID.echo(name).debugDescription)")
        }
        return Download(located: located, action: .captureDownload, detail: "capture \(capture.id) file \(located.file.name)", subject: "capture \(capture.id)")
    }
}
