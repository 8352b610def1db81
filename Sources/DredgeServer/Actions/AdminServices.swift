import DredgeAdminAPI
import Logging

/// What the admin API and the console act on, built once at start-up (``ServerRuntime``) and
/// handed to ``AdminActions``: the stores, the pull machinery, and the optional parts a server
/// may run without (an index, file serving, removal).
public struct AdminServices: Sendable {
    public let registry: any AgentDirectory
    public let pulls: any PullQueue
    public let audit: any AuditLog
    public let issuer: CommandIssuer
    public let feedback: any FeedbackInbox
    public let tokens: any TokenVault
    /// The live tails (#53); nil on a server that runs none.
    public let tails: (any TailRegistry)?
    /// The standing triggers (#54); nil on a server that keeps none.
    public let triggers: (any TriggerRegistry)?
    /// Where the tails' records reach their watchers, and stops reach the devices.
    public let tailHub: TailHub
    public let dispatcher: PullDispatcher
    /// The index searches read; nil on a server that does not index.
    public let records: (any RecordIndex)?
    /// Counts sources still waiting to be indexed; nil without an index.
    public let indexer: Indexer?
    /// The pulled and fed-back files; nil on a server that does not serve them.
    public let files: PullFiles?
    /// Removal and disk use of results; nil on a server that does not remove them.
    public let results: ResultsKeeper?
    /// Where searches are timed (`GET /metrics`); nil: not measured.
    public let metrics: ServerMetrics?
    /// Whether pulls wait for a second person's approval (``ApprovalSettings``).
    public let approvals: ApprovalSettings
    public let logger: Logger

    public init(
        registry: any AgentDirectory, pulls: any PullQueue, audit: any AuditLog, issuer: CommandIssuer, feedback: any FeedbackInbox, tokens: any TokenVault,
        tails: (any TailRegistry)? = nil, triggers: (any TriggerRegistry)? = nil, tailHub: TailHub = TailHub(), dispatcher: PullDispatcher, records: (any RecordIndex)? = nil, indexer: Indexer? = nil, files: PullFiles? = nil, results: ResultsKeeper? = nil,
        metrics: ServerMetrics? = nil, approvals: ApprovalSettings = ApprovalSettings(), logger: Logger
    ) {
        self.metrics = metrics
        self.approvals = approvals
        self.registry = registry
        self.pulls = pulls
        self.audit = audit
        self.issuer = issuer
        self.feedback = feedback
        self.tokens = tokens
        self.tails = tails
        self.triggers = triggers
        self.tailHub = tailHub
        self.dispatcher = dispatcher
        self.records = records
        self.indexer = indexer
        self.files = files
        self.results = results
        self.logger = logger
    }
}
