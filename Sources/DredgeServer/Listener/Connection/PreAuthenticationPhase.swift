import DredgeWire

/// Where a connection stands for the handlers that act only until the agent is authenticated
/// (``PreAuthenticationRecordPacer``, ``PreAuthenticationGatherer``): before, until the
/// connection's ``FrameSizeLimit`` is raised (authentication) or the handler steps aside;
/// from then on everything passes through.
struct PreAuthenticationPhase {
    enum State {
        case before
        /// The first look after the limit was raised.
        case endingNow
        case over
    }

    private let limit: FrameSizeLimit
    private let preAuthenticationBytes: Int
    private(set) var isOver = false

    init(limit: FrameSizeLimit, preAuthenticationBytes: Int) {
        self.limit = limit
        self.preAuthenticationBytes = preAuthenticationBytes
    }

    /// The largest frame body the connection accepts now.
    var frameLimit: Int { limit.bytes }

    mutating func check() -> State {
        if isOver { return .over }
        guard limit.bytes > preAuthenticationBytes else { return .before }
        isOver = true
        return .endingNow
    }

    /// Everything passes from now on: the handler passed on what the next one must refuse.
    mutating func stepAside() { isOver = true }
}
