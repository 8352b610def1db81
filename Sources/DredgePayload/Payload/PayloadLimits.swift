import DredgeDomain

/// What the receiving side accepts in an export zip (README § Payload limits). Everything is
/// checked against what is actually decompressed, never against sizes the zip declares.
public struct PayloadLimits: Sendable, Hashable {
    public static let manifestName = "manifest.json"

    /// Entries in the zip, manifest included. Default 1,000 (more than two years of days).
    public var maxEntries = 1_000
    /// Bytes all entries decompress to. Default 2 GiB.
    public var maxTotalBytes: Int64 = 2 << 30
    /// Bytes the manifest decompresses to. Default 4 MiB.
    public var maxManifestBytes: Int64 = 4 << 20
    /// Uncompressed ÷ compressed bytes of any entry (and of the whole zip). Log text compresses
    /// 5–30×; a zip bomb compresses 1000×. Default 200.
    public var maxCompressionRatio: Int64 = 200

    public init() {}

    /// True for the names an export may contain: `manifest.json` and `YYYY-MM-DD.jsonl`. No
    /// directories, no other separators, no `..`, nothing absolute.
    public static func isAllowedName(_ name: String) -> Bool {
        if name == manifestName { return true }
        let b = Array(name.utf8)
        guard b.count == 16, name.hasSuffix(".jsonl") else { return false }
        for (i, c) in b.prefix(10).enumerated() {
            if i == 4 || i == 7 {
                guard c == UInt8(ascii: "-") else { return false }
            } else {
                guard (48...57).contains(c) else { return false }
            }
        }
        // A date that exists: the parser takes 2026-02-31 as March 3rd, so the day must read back.
        let day = String(name.prefix(10))
        return Timestamp(rfc3339: day)?.utcDay == day
    }
}
