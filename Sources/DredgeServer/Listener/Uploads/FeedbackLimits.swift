import DredgePayload
import Foundation

/// What the server accepts from one agent's feedback uploads (configurable in `server.json`,
/// `"feedback": {…}`): how many per hour, how many bytes (as uploaded) per day, and how large
/// one may unpack. Pulls are asked for by engineers and keep the general payload limits.
public struct FeedbackLimits: Codable, Sendable, Equatable {
    /// Feedback uploads one agent may begin per hour. Default 12.
    public var perHour: Int
    /// Bytes of feedback uploads (zips, as declared in their headers) one agent may begin per
    /// 24 hours. Default 64 MiB.
    public var bytesPerDay: Int64
    /// Bytes one feedback upload may unpack to (its files together). Default 32 MiB.
    public var maxUnpackedBytes: Int64

    public init(perHour: Int = 12, bytesPerDay: Int64 = 64 << 20, maxUnpackedBytes: Int64 = 32 << 20) {
        self.perHour = perHour
        self.bytesPerDay = bytesPerDay
        self.maxUnpackedBytes = maxUnpackedBytes
    }

    public static let `default` = FeedbackLimits()

    /// Keys left out of `server.json` keep their defaults.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = FeedbackLimits()
        perHour = try c.decodeIfPresent(Int.self, forKey: .perHour) ?? d.perHour
        bytesPerDay = try c.decodeIfPresent(Int64.self, forKey: .bytesPerDay) ?? d.bytesPerDay
        maxUnpackedBytes = try c.decodeIfPresent(Int64.self, forKey: .maxUnpackedBytes) ?? d.maxUnpackedBytes
    }
}

extension FeedbackLimits {
    /// What a feedback upload may unpack to: `limits`, with its total cut to ``maxUnpackedBytes``.
    func payloadLimits(within limits: PayloadLimits) -> PayloadLimits {
        var l = limits
        l.maxTotalBytes = min(l.maxTotalBytes, maxUnpackedBytes)
        return l
    }
}
