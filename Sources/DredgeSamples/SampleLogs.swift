import DredgeDomain
import DredgeStore

/// Deterministic, realistic log traffic for the demo, the benchmarks and tests: several users
/// of a media-and-shopping app, over a time span, with business, network, player and app
/// records whose messages and metadata look like what such an app writes.
public struct SampleLogs: Sequence, IteratorProtocol {
    public let uids: [String]
    public let start: Timestamp
    public let end: Timestamp
    public let count: Int
    public let context: ContextID
    private var rng: SplitMix64
    private var produced = 0

    /// `count` entries spread evenly (with jitter) over `start..<end`, in time order.
    public init(count: Int, uids: [String], from start: Timestamp, to end: Timestamp, context: ContextID, seed: UInt64 = 42) {
        precondition(end > start && count >= 0)
        self.count = count
        self.uids = uids
        self.start = start
        self.end = end
        self.context = context
        self.rng = SplitMix64(seed: seed)
    }

    public mutating func next() -> LogEntry? {
        guard produced < count else { return nil }
        let span = end.microseconds - start.microseconds
        let step = Swift.max(1, span / Int64(Swift.max(count, 1)))
        let jitter = Int64(rng.next() % UInt64(Swift.max(1, step)))
        let ts = Timestamp(microseconds: Swift.min(end.microseconds - 1, start.microseconds + Int64(produced) * step + jitter))
        produced += 1
        return entry(at: ts)
    }

    private mutating func pick<T>(_ items: [T]) -> T { items[Int(rng.next() % UInt64(items.count))] }
    private mutating func number(_ range: ClosedRange<Int>) -> Int { range.lowerBound + Int(rng.next() % UInt64(range.count)) }

    private mutating func entry(at ts: Timestamp) -> LogEntry {
        let uid = uids.isEmpty ? "" : (rng.next() % 10 == 0 ? "" : pick(uids))
        let roll = rng.next() % 100
        switch roll {
        case 0..<40: return network(ts, uid)
        case 40..<65: return business(ts, uid)
        case 65..<85: return player(ts, uid)
        default: return app(ts, uid)
        }
    }

    private mutating func network(_ ts: Timestamp, _ uid: String) -> LogEntry {
        let method = pick(["GET", "GET", "GET", "POST", "PUT", "DELETE"])
        let path = pick(["/api/v2/catalog", "/api/v2/cart", "/api/v2/orders", "/api/v2/profile", "/api/v2/stream/manifest", "/api/v2/recommendations"])
        let status = pick([200, 200, 200, 200, 200, 201, 204, 304, 400, 401, 404, 500, 502, 503])
        let duration = number(8...2400)
        let level: LogLevel = status >= 500 ? .error : status >= 400 ? .warning : .info
        return LogEntry(
            timestamp: ts, level: level, type: .network, uid: uid,
            message: "\(method) https://api.example.com\(path) -> \(status) in \(duration) ms",
            metadata: [
                "http.method": .string(method), "http.url": .string("https://api.example.com\(path)"),
                "http.status": .int(Int64(status)), "duration_ms": .int(Int64(duration)),
                "bytes.in": .int(Int64(number(120...250_000))), "bytes.out": .int(Int64(number(0...4_000))),
                "correlation_id": .string(hex(8)),
            ], context: context)
    }

    private mutating func business(_ ts: Timestamp, _ uid: String) -> LogEntry {
        let event = pick(["cart.item_added", "cart.item_removed", "checkout.started", "checkout.completed", "checkout.failed", "coupon.applied", "subscription.renewed"])
        let amount = Double(number(199...25_999)) / 100
        let level: LogLevel = event == "checkout.failed" ? .error : .notice
        return LogEntry(
            timestamp: ts, level: level, type: .business, uid: uid,
            message: event == "checkout.failed" ? "checkout failed: payment declined by issuer" : "\(event) order=\(hex(4)) total=\(amount) EUR",
            metadata: ["event": .string(event), "order": .string("ORD-\(number(10_000...99_999))"), "amount": .double(amount), "currency": "EUR", "items": .int(Int64(number(1...9)))],
            context: context)
    }

    private mutating func player(_ ts: Timestamp, _ uid: String) -> LogEntry {
        let event = pick(["play", "pause", "seek", "buffering", "bitrate_switch", "playback_error", "ended"])
        let level: LogLevel = event == "playback_error" ? .error : event == "buffering" ? .warning : .debug
        return LogEntry(
            timestamp: ts, level: level, type: .player, uid: uid,
            message: event == "playback_error" ? "playback error: decoder stalled on segment \(number(1...900))" : "player \(event) at \(number(0...5400))s",
            metadata: ["track": .string("trk_\(hex(6))"), "position_s": .int(Int64(number(0...5400))), "bitrate_kbps": .int(Int64(pick([800, 1800, 3500, 6000]))), "cdn": .string(pick(["edge-fra-1", "edge-ams-2", "edge-par-1"]))],
            context: context)
    }

    private mutating func app(_ ts: Timestamp, _ uid: String) -> LogEntry {
        let screen = pick(["home", "search", "product", "cart", "settings", "player"])
        let kind = rng.next() % 10
        if kind == 0 {
            return LogEntry(
                timestamp: ts, level: .critical, type: .app, uid: uid, message: "out of memory while decoding artwork on \(screen)",
                metadata: ["screen": .string(screen), "rss_mb": .int(Int64(number(700...1500)))], context: context)
        }
        return LogEntry(
            timestamp: ts, level: kind < 4 ? .trace : .info, type: .app, uid: uid, message: "screen \(screen) shown",
            metadata: ["screen": .string(screen), "render_ms": .int(Int64(number(4...180)))], context: context)
    }

    private mutating func hex(_ bytes: Int) -> String {
        let digits = Array("0123456789abcdef")
        var s = ""
        for _ in 0..<(bytes * 2) { s.append(digits[Int(rng.next() % 16)]) }
        return s
    }
}

/// A small, fast, seedable generator (Steele, Lea, Flood 2014), so sample data is reproducible.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
