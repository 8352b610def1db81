import ArgumentParser
import DredgeAdminAPI
import DredgeAdminClient
import DredgeCommandLine
import DredgeWire
import Foundation

/// `dredge rm`: deletes pulled or feedback files from the server, with their search index
/// rows, before the server's retention would. The pull or feedback stays listed, marked
/// removed; the removal is in the audit log.
struct RemoveCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm",
        abstract: "Delete a pull's (or a feedback's, a live tail's or a capture's) files and search index rows from the server.",
        discussion: """
            The pull stays listed by `dredge pulls`, marked removed, and the removal is recorded in
            the audit log. A pull still running is ended first: its agents' uploads are refused.
            The server deletes results by itself after its retention (`dredge-server run
            --keep-days`, 30 days unless set).
            """)

    @OptionGroup var server: ServerOptions
    @Argument(help: "Pull, feedback, tail or capture ids, or their first 4 or more characters.") var ids: [String]
    @Option(help: "Why (a ticket number, say): recorded in the audit log.") var reason: String?
    @Flag(help: "JSON output: one report per id.") var json = false

    func validate() throws {
        guard !ids.isEmpty else { throw ValidationError("give the id of a pull or a feedback to remove") }
        for id in ids { try IDPrefix.validate(id, flag: "an id") }
        if let reason, let problem = reasonProblem(reason) { throw ValidationError("--reason: \(problem)") }
    }

    func run() async throws {
        let client = try server.client()
        var reports: [RemovalReport] = []
        for text in ids {
            let (kind, id) = try await client.resolveResult(text)
            let report = try await calling {
                switch kind {
                case .pull: try await client.removePull(id, reason: reason)
                case .feedback: try await client.removeFeedback(id, reason: reason)
                case .tail: try await client.removeTail(id, reason: reason)
                case .capture: try await client.removeCapture(id, reason: reason)
                }
            }
            reports.append(report)
            if !json { print(Self.describe(report)) }
        }
        if json { try printJSON(reports) }
    }

    static func describe(_ r: RemovalReport) -> String {
        if r.newlyRemoved {
            return "removed \(r.kind.rawValue) \(r.id): \(Format.bytes(r.freedBytes)) deleted"
                + (r.unindexedSources > 0 ? ", its records are out of the search index" : "")
        }
        return "\(r.kind.rawValue) \(r.id) was removed before, on \(Format.time(r.removal.at)) by \(r.removal.by)"
            + (r.freedBytes > 0 ? "; \(Format.bytes(r.freedBytes)) a late upload left were deleted now" : "")
    }
}

extension AdminClient {
    /// A pull's or a feedback's id from its whole id or a unique start of one, looked up among
    /// the 1000 most recent of each.
    func resolveResult(_ text: String) async throws -> (RemovalReport.Kind, String) {
        if WireID.isValid(text) {
            // A whole id: a pull's, else a live tail's, unless the server knows neither.
            do {
                _ = try await pull(text, diskUse: false)
                return (.pull, text)
            } catch AdminClientError.notFound {
                do {
                    _ = try await tail(text)
                    return (.tail, text)
                } catch AdminClientError.notFound {
                    do {
                        _ = try await capture(text)
                        return (.capture, text)
                    } catch AdminClientError.notFound {
                        return (.feedback, text)
                    }
                } catch let error as AdminClientError {
                    throw failing(error)
                }
            } catch let error as AdminClientError {
                throw failing(error)
            }
        }
        let pulls = Set(try await calling { try await self.pulls(limit: 1000, diskUse: false) }.map(\.id))
        let feedback = Set(try await calling { try await self.feedback(limit: 1000, diskUse: false) }.map(\.id))
        let tails = Set(try await calling { try await self.tails(limit: 1000) }.map(\.id))
        let captures = Set(try await calling { try await self.captures(limit: 1000) }.map(\.id))
        let id = try await IDPrefix.resolve(text, what: "pull, feedback, tail or capture") { Array(pulls.union(feedback).union(tails).union(captures)) }
        return (pulls.contains(id) ? .pull : tails.contains(id) ? .tail : captures.contains(id) ? .capture : .feedback, id)
    }
}
