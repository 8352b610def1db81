import DredgeDomain
import Foundation
import GRDB

/// A stretch of time in which one user's records below the apps' levels are kept too: a live
/// tail asked for them (Protocol § 20, Verbosity). The agent writes it into the store (its
/// `meta` table), every app process sharing the store reads it from there, and it ends at
/// ``until`` whatever becomes of the agent or its connection: nothing has to take it back.
public struct VerbosityWindow: Sendable, Hashable, Codable {
    /// Whose records.
    public var uid: String
    /// Of these types only (empty: every type).
    public var types: [String]
    /// When it ends.
    public var until: Timestamp
    /// Who opened it (the tail's id): opened again, it is replaced; closed by it.
    public var owner: String

    public init(uid: String, types: Set<LogType> = [], until: Timestamp, owner: String) {
        self.uid = uid
        self.types = types.map(\.rawValue).sorted()
        self.until = until
        self.owner = owner
    }

    /// Whether a record of `uid` and `type` at `now` falls in it.
    public func admits(uid: String, type: LogType, at now: Timestamp) -> Bool {
        now < until && uid == self.uid && (types.isEmpty || types.contains(type.rawValue))
    }

    static let key = "verbosity"
    /// Windows a store holds at once, at most (a few tails per agent; more is refused).
    public static let capacity = 64
}

extension LogStore {
    /// The windows open at `now` (those that ended are not returned). A value that does not read
    /// back (damaged, or written by a newer library) opens none.
    public func verbosityWindows(at now: Timestamp = .now) throws -> [VerbosityWindow] {
        do {
            return try pool.read { db in try Self.windows(db) }.filter { now < $0.until }
        } catch let error as DatabaseError {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Opens `window`, replacing one of the same owner; ended windows are dropped as it writes.
    public func openVerbosityWindow(_ window: VerbosityWindow, now: Timestamp = .now) throws {
        guard UserID.isValid(window.uid) else { throw StoreError.invalidArgument("a verbosity window's uid is not a uid") }
        try writeWindows { windows in
            windows.removeAll { $0.owner == window.owner || $0.until <= now }
            guard windows.count < VerbosityWindow.capacity else { throw StoreError.invalidArgument("the store already holds \(VerbosityWindow.capacity) verbosity windows") }
            windows.append(window)
        }
    }

    /// Closes the window `owner` opened (nothing when there is none).
    public func closeVerbosityWindow(owner: String, now: Timestamp = .now) throws {
        try writeWindows { windows in windows.removeAll { $0.owner == owner || $0.until <= now } }
    }

    private func writeWindows(_ change: (inout [VerbosityWindow]) throws -> Void) throws {
        do {
            try pool.write { db in
                var windows = try Self.windows(db)
                try change(&windows)
                let data = try JSONEncoder().encode(windows)
                try db.execute(
                    sql: "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", arguments: [VerbosityWindow.key, data])
            }
        } catch let error as DatabaseError {
            throw StoreError.wrap(error, path: path)
        }
    }

    private static func windows(_ db: Database) throws -> [VerbosityWindow] {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [VerbosityWindow.key]) else { return [] }
        do {
            return try JSONDecoder().decode([VerbosityWindow].self, from: data)
        } catch {
            // Damaged, or a newer library's: it opens no window (the apps keep their levels),
            // and the next window written replaces it. Windows last an hour at most.
            return []
        }
    }
}
