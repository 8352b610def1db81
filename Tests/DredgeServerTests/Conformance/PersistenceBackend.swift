import DredgeServer
import DredgeTestSupport
import Testing

/// One implementation of the server's persistence protocols, made fresh in a temporary
/// directory for each test. The conformance suites run every rule against each backend in
/// ``all``; a second back end (PostgreSQL) is added here and must pass the same tests.
struct PersistenceBackend: Sendable, CustomTestStringConvertible {
    let name: String
    let pulls: @Sendable (TempDir) async throws -> any PullQueue & AuditLog
    let agents: @Sendable (TempDir) async throws -> any AgentDirectory
    let feedback: @Sendable (TempDir) async throws -> any FeedbackInbox
    let tokens: @Sendable (TempDir) async throws -> any TokenVault
    let records: @Sendable (TempDir) async throws -> any RecordIndex
    var testDescription: String { name }

    static let sqlite = PersistenceBackend(
        name: "SQLite",
        pulls: { PullStore(try ServerDatabase(directory: $0.path)) },
        agents: { AgentRegistry(try ServerDatabase(directory: $0.path)) },
        feedback: { FeedbackStore(try ServerDatabase(directory: $0.path)) },
        tokens: { TokenStore(try ServerDatabase(directory: $0.path)) },
        records: { try RecordIndexStore(directory: $0.path) })

    static let all: [PersistenceBackend] = [.sqlite]
}
