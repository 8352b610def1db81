/// The server's stores over its one database in a data directory (``ServerDatabase``), opened
/// the one way `dredge-server run`, the command-line tools and the tests open them, and the
/// ``CommandIssuer`` over the deployment's keys.
public struct ServerStores: Sendable {
    public let database: ServerDatabase
    public let registry: AgentRegistry
    public let pulls: PullStore
    public let feedback: FeedbackStore
    public let tokens: TokenStore
    /// The search index, `index.sqlite` beside the database.
    public let records: RecordIndexStore
    public let issuer: CommandIssuer

    public init(_ deployment: LoadedDeployment) throws {
        database = try ServerDatabase(directory: deployment.directory)
        registry = AgentRegistry(database)
        pulls = PullStore(database)
        feedback = FeedbackStore(database)
        tokens = TokenStore(database)
        records = try RecordIndexStore.openOrRebuild(directory: deployment.directory)
        issuer = CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
    }
}
