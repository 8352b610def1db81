import DredgeDomain

/// What an agent says it is (`HostInfo`, sent at enrollment and on every authentication), kept
/// within the protocol's bounds (Protocol/README.md § Enrollment): the server shows these
/// values to engineers, so they are short, printable text.
extension WireHostInfo {
    /// Bytes of UTF-8 in `hostname`, `os`, `app`, `app_version`, and in a label's value.
    public static let maxFieldBytes = 256
    /// Labels (`extra`) kept, and the bytes of a label's key.
    public static let maxLabels = 32
    public static let maxLabelKeyBytes = 64

    /// The same description within bounds: control and bidirectional-control characters become U+FFFD, a value is cut at
    /// the last whole character that fits, labels with an empty key are dropped, and beyond
    /// ``maxLabels`` the first keys in byte order are kept.
    public var bounded: WireHostInfo {
        var info = WireHostInfo()
        info.hostname = Self.clean(hostname, max: Self.maxFieldBytes)
        info.os = Self.clean(os, max: Self.maxFieldBytes)
        info.app = Self.clean(app, max: Self.maxFieldBytes)
        info.appVersion = Self.clean(appVersion, max: Self.maxFieldBytes)
        var labels: [String: String] = [:]
        for key in extra.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            let k = Self.clean(key, max: Self.maxLabelKeyBytes)
            guard !k.isEmpty, labels[k] == nil, labels.count < Self.maxLabels else { continue }
            labels[k] = Self.clean(extra[key] ?? "", max: Self.maxFieldBytes)
        }
        info.extra = labels
        return info
    }

    /// How the device names itself: the context of its newest record (host name, app and the
    /// app's version, labels), over `fallback` (the agent process's own host name and OS, and
    /// whatever the operator set). A field the operator set in `overrides` wins over both.
    public static func describing(_ context: LogContext?, fallback: WireHostInfo, overrides: WireHostInfo = WireHostInfo()) -> WireHostInfo {
        var info = fallback
        if let context {
            if !context.host.isEmpty { info.hostname = context.host }
            if !context.os.isEmpty { info.os = context.os }
            if !context.app.isEmpty { info.app = context.app }
            if !context.appVersion.isEmpty { info.appVersion = context.appVersion }
            info.extra.merge(context.extra) { _, new in new }
        }
        if !overrides.hostname.isEmpty { info.hostname = overrides.hostname }
        if !overrides.os.isEmpty { info.os = overrides.os }
        if !overrides.app.isEmpty { info.app = overrides.app }
        if !overrides.appVersion.isEmpty { info.appVersion = overrides.appVersion }
        info.extra.merge(overrides.extra) { _, new in new }
        return info.bounded
    }

    /// Control characters, and the bidirectional controls that make a terminal show text in
    /// another order than it is (U+202A–U+202E, U+2066–U+2069).
    static func isReplaced(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value)
    }

    /// `text` as a host info value: replaced characters as U+FFFD, cut at the last whole
    /// character within `max` bytes.
    public static func clean(_ text: String, max: Int = maxFieldBytes) -> String {
        var out = String.UnicodeScalarView()
        var bytes = 0
        for scalar in text.unicodeScalars {
            let s: Unicode.Scalar = isReplaced(scalar) ? "\u{FFFD}" : scalar
            let size = String(s).utf8.count
            guard bytes + size <= max else { break }
            bytes += size
            out.append(s)
        }
        return String(out)
    }
}
