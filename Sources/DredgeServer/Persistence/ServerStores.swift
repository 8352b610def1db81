/// The server's stores in a data directory, opened the one way `dredge-server run`, the
/// command-line tools and the tests open them (one place to change when they become one
/// database), and the ``CommandIssuer`` over the deployment's keys.
public struct ServerStores: Sendable {
    public let registry: AgentRegistry
    public let pulls: PullStore
    public let feedback: FeedbackStore
    public let tokens: TokenStore
    public let issuer: CommandIssuer

    public init(_ deployment: LoadedDeployment) throws {
        let dir = deployment.directory
        registry = try AgentRegistry(path: dir + "/server.sqlite")
        pulls = try PullStore(path: dir + "/pulls.sqlite")
        feedback = try FeedbackStore(path: dir + "/feedback.sqlite")
        tokens = TokenStore(path: dir + "/tokens.json", file: deployment.tokens)
        issuer = CommandIssuer(encryptionKey: deployment.encryptionKey, signingKey: deployment.signingKey)
    }
}
