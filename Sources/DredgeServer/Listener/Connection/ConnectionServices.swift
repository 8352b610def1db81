import DredgeDomain
import DredgeWire
import Logging

/// What every connection of the agent listener works with, made once when the listener starts:
/// the stores, the deployment's keys, the limits, the bookkeeping all connections share, and
/// the pools that run blocking work. A connection's session, its deliveries and its uploads take
/// what they need from here, never from the listener.
///
/// A class, so that each connection holds one reference to it: as a value, every idle
/// connection's session carried a copy of all seventeen fields, four of them existentials.
final class ConnectionServices: Sendable {
    let registry: any AgentDirectory
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    let tokens: any TokenVault
    /// The live tails (#53); nil: this server agrees to no `live-tail`.
    let tails: (any TailRegistry)?
    /// Where what the tails hold goes to their watchers.
    let tailHub: TailHub
    /// One connection at a time works on one agent's part of a tail (``ConnectionTails``).
    let tailParts = KeyedLock()
    /// The standing triggers and their captures (#54); nil: this server agrees to no `triggers`.
    let triggers: (any TriggerRegistry)?
    /// The triggers in force, read once per change for every connection.
    let triggerSets: TriggerSetSource
    /// What the server agrees to in `HelloAck` (``WireCapability``).
    var capabilities: [String] {
        WireCapability.known.filter { ($0 != WireCapability.liveTail || tails != nil) && ($0 != WireCapability.triggers || triggers != nil) }
    }
    let dispatcher: PullDispatcher
    /// Makes pull commands, and keeps the keys of the pulls made or delivered lately.
    let issuer: CommandIssuer
    let deployment: LoadedDeployment
    let paths: DataDirectory
    /// What the server tells each agent once it is authenticated (heartbeat interval, window,
    /// largest chunk).
    let session: WireAuthResult
    let feedbackLimits: FeedbackLimits
    let gate: ConnectionGate
    let agentConnections: AgentConnections
    /// Enrollment and authentication refusals, logged at most a few a minute.
    let refusals: RateLimitedLog
    /// Refused enrollments per address, throttled.
    let enrollmentThrottle: EnrollmentThrottle
    let counters: ConnectionCounters
    let work: ServerWork
    /// Told of each pull or feedback whose files are in place (the ``Indexer``).
    let landed: @Sendable (IndexedSource, _ records: Int) -> Void
    /// Where events are counted for `GET /metrics`.
    let metrics: ServerMetrics
    let logger: Logger
    /// The node's cap on upload chunk bytes a second, shared fairly among agents (nil: none).
    let ingress: IngressGovernor?

    init(
        registry: any AgentDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, tokens: any TokenVault, tails: (any TailRegistry)?, tailHub: TailHub, triggers: (any TriggerRegistry)?,
        triggerSets: TriggerSetSource, dispatcher: PullDispatcher, issuer: CommandIssuer, deployment: LoadedDeployment, paths: DataDirectory, session: WireAuthResult, feedbackLimits: FeedbackLimits,
        gate: ConnectionGate, agentConnections: AgentConnections, refusals: RateLimitedLog, enrollmentThrottle: EnrollmentThrottle,
        counters: ConnectionCounters, work: ServerWork, landed: @escaping @Sendable (IndexedSource, _ records: Int) -> Void,
        metrics: ServerMetrics, logger: Logger, ingress: IngressGovernor? = nil
    ) {
        self.ingress = ingress
        self.enrollmentThrottle = enrollmentThrottle
        self.registry = registry
        self.pulls = pulls
        self.feedback = feedback
        self.tokens = tokens
        self.tails = tails
        self.tailHub = tailHub
        self.triggers = triggers
        self.triggerSets = triggerSets
        self.dispatcher = dispatcher
        self.issuer = issuer
        self.deployment = deployment
        self.paths = paths
        self.session = session
        self.feedbackLimits = feedbackLimits
        self.gate = gate
        self.agentConnections = agentConnections
        self.refusals = refusals
        self.counters = counters
        self.work = work
        self.landed = landed
        self.metrics = metrics
        self.logger = logger
    }
}
