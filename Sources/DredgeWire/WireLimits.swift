import DredgeDomain

/// The protocol's named limits. Each cites the section of Protocol/README.md that defines it;
/// changing one is a protocol change.
public enum WireLimits {
    /// § Versioning: the only version so far.
    public static let protocolVersion: UInt32 = 1
    /// § Framing: the largest frame body a peer accepts (the 4-byte length prefix excluded).
    public static let maxFrameBytes = 2 * 1024 * 1024
    /// § Framing: the largest frame body a server accepts before the agent is authenticated
    /// (Hello, AuthResponse, EnrollRequest all fit in a few kilobytes).
    public static let maxPreAuthFrameBytes = 16 * 1024
    /// § Connection states: how long a server waits for TLS, Hello and authentication together.
    public static let defaultHandshakeSeconds: UInt32 = 10
    /// § Heartbeats: intervals without a frame (server) or an ack (agent) before the
    /// connection is given up.
    public static let missedHeartbeatsBeforeClose: UInt32 = 3
    /// § Uploads: plaintext bytes per chunk an agent uses unless told otherwise.
    public static let defaultChunkBytes = 256 * 1024
    /// § Uploads: the largest plaintext chunk; with the tag and framing it fits a frame.
    public static let maxChunkBytes = 1024 * 1024
    /// § Uploads: the smallest chunk size (except the last chunk).
    public static let minChunkBytes = 4 * 1024
    /// § Uploads: the most chunks one upload may have (a 4 GiB upload at 64 KiB chunks).
    public static let maxChunkCount = 65_536
    /// § Uploads: unacknowledged chunks in flight per upload, by default and at most.
    public static let defaultWindow = 8
    public static let maxWindow = 64
    /// § Envelope: bytes of the random per-upload nonce prefix.
    public static let noncePrefixBytes = 7
    /// § Envelope: AES-GCM tag bytes appended to each chunk.
    public static let tagBytes = 16
    /// § Identities: bytes in an id (command, upload, agent, feedback).
    public static let maxIDBytes = 64
    /// § Heartbeats: uids one heartbeat may list.
    public static let maxActiveUIDs = DomainLimits.activeUIDs
    /// § Heartbeats: users one user report may list.
    public static let maxReportedUsers = DomainLimits.reportedUsers
    /// § Heartbeats: a reported user's last-seen time is truncated to this (one hour), so a
    /// user who keeps logging changes the report at most once an hour.
    public static let userReportGranularityMicroseconds: Int64 = 3_600 * 1_000_000
    /// § Pull commands: how far a command's issued_at may be ahead of the agent's clock.
    public static let clockSkewMicroseconds: Int64 = 5 * 60 * 1_000_000
    /// § Authentication: bytes of the server's challenge.
    public static let challengeBytes = 32
    /// § Heartbeats: default interval.
    public static let defaultHeartbeatSeconds: UInt32 = 30
    /// § Pull commands, Deadlines: a delivered pull past its expiry that nothing was heard of
    /// for this long (server downtime not counted) expires. A protocol value: no sooner.
    public static let pullQuietPeriod: Duration = .seconds(15 * 60)
    /// § Pull commands, Deadlines: a delivered pull still open this long after its expiry
    /// expires, however recently it was heard of.
    public static let pullExpiryGrace: Duration = .seconds(24 * 3600)
    /// § Pull commands, Deadlines: a feedback upload not completed this long after its first
    /// UploadBegin fails.
    public static let feedbackLifetime: Duration = .seconds(7 * 86_400)
    /// § Connection states, Planned restarts: the longest `back_within_ms` an agent honours.
    public static let maxRestartWindow: Duration = .seconds(600)
    /// § Connection states, Planned restarts: `retry_every_ms` when 0, and its bounds.
    public static let defaultRestartRetry: Duration = .seconds(2)
    public static let restartRetryRange: ClosedRange<Duration> = .seconds(1) ... .seconds(60)

    /// § Live tail: the longest a tail runs (expires_at − issued_at).
    public static let maxTailDurationMicroseconds: Int64 = 3600 * 1_000_000
    /// § Live tail: tails one agent runs at once (the next is `REJECT_BUSY`).
    public static let maxTailsPerAgent = 4
    /// § Live tail: the bounds of a tail's rates.
    public static let tailRecordRate: ClosedRange<UInt32> = 1...10_000
    public static let tailByteRate: ClosedRange<UInt64> = 1024...16 * 1024 * 1024
    /// § Live tail: records in one batch, and the most bytes of its ciphertext (tag included).
    public static let maxTailBatchRecords = 1_000
    public static let maxTailBatchBytes = 256 * 1024
    /// § Live tail: the most left-out records one batch may count (`dropped`).
    public static let maxTailBatchDropped: UInt64 = 4_294_967_295
    /// § Live tail: batches sent and not yet acknowledged.
    public static let maxTailInFlight = 16
    /// § Live tail: how long after its expiry a server still takes a tail's batches.
    public static let tailExpiryGrace: Duration = .seconds(60)

    /// § Triggers: triggers in one agent's set.
    public static let maxTriggersPerSet = 64
    /// § Triggers: bytes of a trigger's name, of a metadata member's name, of an app name and
    /// of an app version bound.
    public static let triggerNameBytes = 256
    public static let triggerMetadataKeyBytes = 256
    public static let triggerAppBytes = 256
    public static let triggerAppVersionBytes = 64
    /// § Triggers: bytes of a metadata value a trigger compares (as a filter's text).
    public static let triggerMetadataValueBytes = 1_024
    /// § Triggers: the longest window before and after a match, in seconds.
    public static let maxCaptureBeforeSeconds: UInt32 = 3_600
    public static let maxCaptureAfterSeconds: UInt32 = 600
    /// § Triggers: the most captures one trigger may ask of one device in a rolling day.
    public static let maxCapturesPerDeviceDay: UInt32 = 100
    /// CAPTURE_LIFETIME: a capture not complete this long after its first `UploadBegin` fails (§ 21).
    public static let captureLifetime: Duration = feedbackLifetime
}

/// What a peer can do beyond the base protocol, named in `Hello.capabilities` and agreed in
/// `HelloAck.capabilities` (README § 4, Capabilities).
public enum WireCapability {
    /// The server's keys roll over, announced in heartbeat acks (README § 5, Key rotation).
    public static let keyRotation = "key-rotation"
    /// The server asks for a user's new records; the agent streams them (README § 20, Live tail).
    public static let liveTail = "live-tail"
    /// The server sends standing triggers; the agent uploads captures of what fires them
    /// (README § 21, Triggers and captures).
    public static let triggers = "triggers"
    /// The server marks the pulls and tails an engineer made urgent; the agent may refuse a
    /// tail its upload policy holds (README § 22, Polite uploads).
    public static let urgent = "urgent"
    /// Every capability this release agrees to (a server without a tail registry leaves
    /// `live-tail` out; one without a trigger registry, `triggers`).
    public static let known: [String] = [keyRotation, liveTail, triggers, urgent]

    /// Of `listed`, those in `known`, in the order listed, each once.
    public static func agreed(_ listed: [String], known: [String] = known) -> [String] {
        var agreed: [String] = []
        for name in listed where known.contains(name) && !agreed.contains(name) { agreed.append(name) }
        return agreed
    }
}
