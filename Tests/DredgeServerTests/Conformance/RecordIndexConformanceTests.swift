import DredgeAdminAPI
import DredgeDomain
import DredgeServer
import DredgeTestSupport
import Foundation
import Testing

/// The rules of ``RecordIndex``, run against every ``PersistenceBackend``.
@Suite struct RecordIndexConformanceTests {
    let dir = TempDir()

    static func id(_ n: Int) -> String { String(format: "%032x", n) }
    static let agentA = String(repeating: "a", count: 32)
    static let agentB = String(repeating: "b", count: 32)
    static let pull1 = IndexedSource(kind: .pull, id: id(1), agentID: agentA)
    static let pull1b = IndexedSource(kind: .pull, id: id(1), agentID: agentB)
    static let feedback2 = IndexedSource(kind: .feedback, id: id(2), agentID: agentA)
    static let contexts = [
        "1": LogContext(host: "kitchen-oven", os: "Linux", app: "oven-control", appVersion: "2.4.1", process: "oven[7]"),
        "2": LogContext(host: "bakery-oven", os: "Linux", app: "oven-ui", appVersion: "1.0", process: "ui[9]"),
    ]

    /// A payload line in the writer's form (Protocol § Payload).
    static func line(_ seconds: Int, _ message: String, level: String = "info", type: String = "app", uid: String = "u-1", metadata: String = "{}", context: Int = 1)
        -> String
    {
        let ts = Timestamp(microseconds: Int64(1_800_000_000 + seconds) * 1_000_000 + 250_000).rfc3339
        let escaped = message.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
        return #"{"ts":"\#(ts)","level":"\#(level)","type":"\#(type)","uid":"\#(uid)","message":"\#(escaped)","metadata":\#(metadata),"context":\#(context)}"#
    }

    static func at(_ seconds: Int) -> Timestamp { Timestamp(microseconds: Int64(1_800_000_000 + seconds) * 1_000_000 + 250_000) }

    func indexed(_ backend: PersistenceBackend, _ sources: [(IndexedSource, [String])]) async throws -> any RecordIndex {
        let index = try await backend.records(dir)
        for (source, lines) in sources {
            try await index.begin(source, contexts: Self.contexts, landedAt: Date())
            let count = try await index.add(source, lines: Array((lines.joined(separator: "\n") + "\n").utf8))
            #expect(count == IndexCount(records: lines.count, unreadable: 0))
            try await index.finish(source)
        }
        return index
    }

    func messages(_ index: any RecordIndex, _ search: RecordSearch) async throws -> [String] {
        try await index.search(search).records.map(\.message)
    }

    @Test(arguments: PersistenceBackend.all)
    func recordsComeBackWithTheirSourceAndContext(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [Self.line(10, "GET /cart -> 503", level: "error", type: "network", metadata: #"{"http.status":503,"tags":["a"]}"#)]),
            (Self.pull1b, [Self.line(5, "from b", level: "debug", uid: "", context: 2)]),
        ])
        let page = try await index.search(RecordSearch())
        #expect(page.records.map(\.message) == ["from b", "GET /cart -> 503"], "ordered by time across sources")
        let r = try #require(page.records.last)
        #expect(r.ts == Self.at(10) && r.level == "error" && r.type == "network" && r.uid == "u-1" && r.agentID == Self.agentA)
        #expect(r.sourceKind == "pull" && r.sourceID == Self.id(1) && r.host == "kitchen-oven" && r.app == "oven-control" && r.appVersion == "2.4.1")
        #expect(r.metadata.value == .object(["http.status": .integer(503), "tags": .array([.string("a")])]))
        #expect(page.records.first?.host == "bakery-oven" && page.records.first?.uid == "")
        #expect(page.next == nil)
        #expect(try await index.indexedSources() == [Self.pull1, Self.pull1b])
    }

    /// #49 (Protocol § 13): a line of a day file is a record only inside the UTC day its file is
    /// named for, and only with a type of the § 5 grammar; others are counted, never stored.
    @Test(arguments: PersistenceBackend.all)
    func aRecordOutsideItsFilesDayOrWithAnInvalidTypeIsSetAside(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        let day = try #require(LineAdmission(file: "2026-11-20.jsonl", uid: nil))
        #expect(day.day == 1_795_132_800_000_000..<1_795_219_200_000_000)
        #expect(LineAdmission(file: "manifest.json", uid: nil) == nil && LineAdmission(file: "2026-02-30.jsonl", uid: nil) == nil)
        func line(_ ts: String, _ message: String, type: String = "app") -> String {
            #"{"ts":"\#(ts)","level":"info","type":"\#(type)","uid":"u-1","message":"\#(message)"}"#
        }
        let lines = [
            line("2026-11-20T00:00:00.000000Z", "first instant"), line("2026-11-20T23:59:59.999999Z", "last instant"),
            line("2026-11-19T23:59:59.999999Z", "the day before"), line("2026-11-21T00:00:00.000000Z", "the day after"),
            line("2026-11-20T12:00:00.000000Z", "capital type", type: "Network"), line("2026-11-20T12:00:00.000000Z", "a space", type: "my type"),
            line("2026-11-20T12:00:00.000000Z", "escaped valid type", type: #"app\u0073"#), line("2026-11-20T12:00:00.000000Z", "dotted", type: "net.http-2_x"),
            line("2026-11-20T12:00:00.000000Z", "escaped capital", type: #"\u0041pp"#),
        ]
        let count = try await index.add(Self.pull1, lines: Array((lines.joined(separator: "\n") + "\n").utf8), admitting: day)
        #expect(count == IndexCount(records: 4, unreadable: 5))
        try await index.finish(Self.pull1)
        #expect(Set(try await index.search(RecordSearch()).records.map(\.message)) == ["first instant", "last instant", "escaped valid type", "dotted"])
        // A record of another uid is foreign whatever its day (and counted as planted).
        try await index.begin(Self.pull1b, contexts: Self.contexts, landedAt: Date())
        let planted = line("2026-11-19T12:00:00.000000Z", "planted, off its day").replacingOccurrences(of: "u-1", with: "u-2")
        let other = try #require(LineAdmission(file: "2026-11-20.jsonl", uid: "u-1"))
        #expect(try await index.add(Self.pull1b, lines: Array((planted + "\n").utf8), admitting: other) == IndexCount(foreign: 1))
    }

    /// #50: the types, hosts and apps records have, as the search's filters match them: hosts by
    /// the registered device (by the contexts for a source without one), types of every record
    /// ever added (a removed source's stay known), in byte order.
    @Test(arguments: PersistenceBackend.all)
    func theVocabularyIsWhatTheFiltersCanMatch(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        #expect(try await index.vocabulary() == RecordVocabulary())
        try await index.begin(Self.pull1, contexts: Self.contexts, device: RegisteredDevice(hostname: "rogue", os: "Linux", app: "oven-control", appVersion: "9"), landedAt: Date())
        _ = try await index.add(Self.pull1, lines: Array(([Self.line(1, "a", type: "network"), Self.line(2, "b", type: "business")].joined(separator: "\n") + "\n").utf8))
        try await index.finish(Self.pull1)
        try await index.begin(Self.feedback2, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.feedback2, lines: Array((Self.line(3, "c", type: "player") + "\n").utf8))
        try await index.finish(Self.feedback2)

        let vocabulary = try await index.vocabulary()
        #expect(vocabulary.types == ["business", "network", "player"])
        #expect(vocabulary.hosts == ["bakery-oven", "kitchen-oven", "rogue"], "registered, and the contexts of a source without a device")
        #expect(vocabulary.apps == ["oven-control", "oven-ui"] && !vocabulary.more)
        #expect(try await index.search(RecordSearch(hosts: ["rogue"])).records.map(\.message) == ["a", "b"], "a listed host matches")

        try await index.remove(Self.feedback2)
        let after = try await index.vocabulary()
        #expect(after.types == ["business", "network", "player"], "a type seen stays known")
        #expect(after.hosts == ["rogue"])
        #expect(after.unknown(types: ["netwrok", "network"], hosts: ["Rogue"], apps: nil).map(\.description) == [
            #"no record has type "netwrok"; known: "network", "player", "business""#,
            #"no record has host "Rogue"; known: "rogue""#,
        ])
    }

    /// #50: a search's counts, per level and host and over time, are those of the records its
    /// filters match, whatever its cursor and page size (a pull from two devices: the per-source
    /// statement; full text: the words' index).
    @Test(arguments: PersistenceBackend.all)
    func statsCountWhatTheFiltersMatch(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [Self.line(10, "a declined", level: "error"), Self.line(20, "b", level: "warning"), Self.line(30, "c declined", level: "error")]),
            (Self.pull1b, [Self.line(15, "d", uid: "u-2", context: 2), Self.line(25, "e declined")]),
            (Self.feedback2, [Self.line(40, "f")]),
        ])
        var search = RecordSearch(pull: Self.id(1))
        search.after = "1.1"
        search.limit = 1
        let stats = try await index.stats(search)
        #expect(stats.total == 5 && stats.complete)
        #expect(stats.levels == ["error": 2, "warning": 1, "info": 2])
        #expect(stats.hosts == ["kitchen-oven": 4, "bakery-oven": 1])
        #expect(stats.from == Self.at(10) && stats.to == Timestamp(microseconds: Self.at(30).microseconds + 1))
        #expect(stats.buckets.map { $0.values.reduce(0, +) }.reduce(0, +) == 5 && stats.buckets.first == ["error": 1] && stats.buckets.last == ["error": 1])
        var words = RecordSearch(text: "declined")
        words.levels = ["error"]
        #expect(try await index.stats(words).total == 2)
        #expect(try await index.stats(RecordSearch(uid: "u-2")).hosts == ["bakery-oven": 1])
        #expect(try await index.stats(RecordSearch(uid: "nobody")) == RecordStats())

        // Records before 1970 (a negative first time) are counted too: the statement stays whole.
        try await index.begin(Self.feedback2, contexts: Self.contexts, landedAt: Date())
        let old = [#"{"ts":"1969-12-31T23:59:00.000000Z","level":"info","type":"app","uid":"old","message":"m","context":1}"#,
                   #"{"ts":"1969-12-31T23:59:30.000000Z","level":"error","type":"app","uid":"old","message":"n","context":1}"#]
        _ = try await index.add(Self.feedback2, lines: Array((old.joined(separator: "\n") + "\n").utf8))
        try await index.finish(Self.feedback2)
        let before1970 = try await index.stats(RecordSearch(uid: "old"))
        #expect(before1970.total == 2 && before1970.levels == ["info": 1, "error": 1] && before1970.from == Timestamp(microseconds: -60_000_000))
        #expect(before1970.buckets.first == ["info": 1] && before1970.buckets.last == ["error": 1])
    }

    /// #49: a source is named by the device its agent is registered as, with a context's other
    /// host or app kept as claimed beside it (and searched by the registered names only); with
    /// `onlyUID`, records of another uid are counted and never stored. Sources begun without a
    /// device are named by their contexts, as before.
    @Test(arguments: PersistenceBackend.all)
    func recordsAreNamedByTheRegisteredDeviceAndHoldOnlyTheUidAskedFor(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        let device = RegisteredDevice(hostname: "rogue", os: "Linux", app: "oven-control", appVersion: "9")
        try await index.begin(Self.pull1, contexts: Self.contexts, device: device, landedAt: Date())
        let lines = [
            Self.line(1, "asked", uid: "u-9"), Self.line(2, "planted", uid: "u-1"), Self.line(3, "no uid", uid: ""),
            #"{"ts":"\#(Self.at(4).rfc3339)","level":"info","type":"app","uid":"u\u002d9","message":"escaped","context":2}"#,
            #"{"ts":"\#(Self.at(5).rfc3339)","level":"info","type":"app","message":"uid left out"}"#,
        ]
        let count = try await index.add(Self.pull1, lines: Array((lines.joined(separator: "\n") + "\n").utf8), admitting: LineAdmission(uid: "u-9"))
        #expect(count == IndexCount(records: 2, unreadable: 0, foreign: 3))
        try await index.finish(Self.pull1)
        // Without a device: the contexts' names, no claim.
        try await index.begin(Self.pull1b, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.pull1b, lines: Array((Self.line(6, "legacy", uid: "u-9") + "\n").utf8))
        try await index.finish(Self.pull1b)

        let found = try await index.search(RecordSearch(uid: "u-9")).records
        #expect(found.map(\.message) == ["asked", "escaped", "legacy"])
        let (asked, escaped, legacy) = (found[0], found[1], found[2])
        // The host from the registry; the app, version and OS of the process that wrote it, from its context.
        #expect(asked.host == "rogue" && asked.claimedHost == "kitchen-oven" && asked.app == "oven-control" && asked.appVersion == "2.4.1")
        #expect(asked.process == "oven[7]")
        #expect(escaped.host == "rogue" && escaped.claimedHost == "bakery-oven" && escaped.app == "oven-ui")
        #expect(legacy.host == "kitchen-oven" && legacy.claimedHost == nil && legacy.app == "oven-control")
        #expect(try await index.search(RecordSearch(uid: "u-1")).records.isEmpty)
        #expect(try await messages(index, RecordSearch(hosts: ["rogue"])) == ["asked", "escaped"])
        #expect(try await messages(index, RecordSearch(hosts: ["kitchen-oven"])) == ["legacy"])
        #expect(try await messages(index, RecordSearch(hosts: ["bakery-oven"])).isEmpty)
        #expect(try await messages(index, RecordSearch(apps: ["oven-ui"])) == ["escaped"])
        #expect(try await messages(index, RecordSearch(apps: ["oven-control"])) == ["asked", "legacy"])
        // #49: a number no float holds is refused with its reason on both back ends (PostgreSQL
        // answered a server error); one that fits is searched.
        for value in ["1e999999", "-1e999999", "1e-999999", "0.5e-400", "0e-999999", "1E+99999999999999999999", "0e-9223372036854775808", "0e-00000000001001"] {
            let error = await #expect(throws: RecordSearchError.self, "\(value)") { try await index.search(RecordSearch(metadata: [MetadataMatch(key: "n", value: value)])) }
            #expect(error?.description.contains(value) == true)
        }
        for value in ["1e300", "0e-300", "0", "1e-300", "-2.5E+10", "1e-0000000000300"] {
            #expect(try await index.search(RecordSearch(metadata: [MetadataMatch(key: "n", value: value)])).records.isEmpty, "\(value)")
        }
        let read = try #require(try await index.record(asked.id, context: 1))
        #expect(read.record.claimedHost == "kitchen-oven" && read.after.first?.claimedHost == "bakery-oven")
    }

    @Test(arguments: PersistenceBackend.all)
    func linesThatAreNotRecordsAreCountedAndLeftOut(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        let lines = [
            Self.line(1, "good one"),
            "not json at all",
            #"{"ts":"2026-11-20T10:00:00Z","level":"info","type":"app","message":"short ts"}"#,
            #"{"ts":"2026-13-45T10:00:00.000000Z","level":"info","type":"app","message":"no such day"}"#,
            #"{"ts":"2026-11-20T10:00:00.000000Z","level":"loud","type":"app","message":"unknown level"}"#,
            #"{"ts":"2026-11-20T10:00:00.000000Z","level":"info","message":"no type"}"#,
            #"{"ts":12,"level":"info","type":"app","message":"numeric ts"}"#,
            #"[1,2,3]"#,
            #"{"ts":"2026-11-20T10:00:00.000000Z","level":"info","type":"app","message":"#,
            // Members in another order, unknown members, no uid: still a record.
            #"{"message":"reordered","extra":{"x":1},"type":"app","level":"warning","ts":"2026-11-20T10:00:00.000001Z","context":1}"#,
        ]
        let count = try await index.add(Self.pull1, lines: Array((lines.joined(separator: "\n") + "\n\n").utf8))
        #expect(count == IndexCount(records: 2, unreadable: 8))
        try await index.finish(Self.pull1)
        let found = try await index.search(RecordSearch()).records
        #expect(Set(found.map(\.message)) == ["good one", "reordered"])
        #expect(found.first { $0.message == "reordered" }.map { $0.uid == "" && $0.metadata.value == .object([:]) && $0.level == "warning" } == true)
    }

    @Test(arguments: PersistenceBackend.all)
    func beginningAgainReplacesAnUnfinishedAttempt(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.pull1, lines: Array((Self.line(1, "first try") + "\n").utf8))
        #expect(try await index.indexedSources().isEmpty, "not finished: not listed")
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.pull1, lines: Array((Self.line(1, "second try") + "\n").utf8))
        try await index.finish(Self.pull1)
        #expect(try await messages(index, RecordSearch()) == ["second try"])
        #expect(try await index.indexedSources() == [Self.pull1])
    }

    @Test(arguments: PersistenceBackend.all)
    func removeTakesASourcesRecordsAndWordsAway(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [Self.line(1, "oven overheated")]),
            (Self.feedback2, [Self.line(2, "oven door open")]),
        ])
        try await index.remove(Self.pull1)
        #expect(try await messages(index, RecordSearch(text: "oven")) == ["oven door open"])
        #expect(try await messages(index, RecordSearch(text: "overheated")).isEmpty)
        #expect(try await index.indexedSources() == [Self.feedback2])
        try await index.remove(Self.pull1)  // again: no error
    }

    @Test(arguments: PersistenceBackend.all)
    func everyFilterNarrows(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [
                Self.line(1, "one", level: "info", type: "app", uid: "u-1"),
                Self.line(2, "two", level: "warning", type: "network", uid: "u-2"),
                Self.line(3, "three", level: "error", type: "network", uid: "u-1", context: 2),
            ]),
            (Self.pull1b, [Self.line(4, "four", level: "critical", type: "player", uid: "u-1")]),
            (Self.feedback2, [Self.line(5, "five", level: "notice", type: "business", uid: "u-3")]),
        ])
        #expect(try await messages(index, RecordSearch(uid: "u-1")) == ["one", "three", "four"])
        #expect(try await messages(index, RecordSearch(since: Self.at(2), until: Self.at(4))) == ["two", "three"])
        #expect(try await messages(index, RecordSearch(levels: ["error", "critical"])) == ["three", "four"])
        #expect(try await messages(index, RecordSearch(types: ["network"])) == ["two", "three"])
        #expect(try await messages(index, RecordSearch(agents: [Self.agentB])) == ["four"])
        #expect(try await messages(index, RecordSearch(pull: Self.id(1))) == ["one", "two", "three", "four"])
        #expect(try await messages(index, RecordSearch(feedback: Self.id(2))) == ["five"])
        #expect(try await messages(index, RecordSearch(pull: Self.id(2))).isEmpty, "a feedback is not a pull")
        #expect(try await messages(index, RecordSearch(hosts: ["bakery-oven"])) == ["three"])
        #expect(try await messages(index, RecordSearch(apps: ["oven-control"])) == ["one", "two", "four", "five"])
        #expect(try await messages(index, RecordSearch(uid: "u-1", levels: ["error"], types: ["network"])) == ["three"])
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(levels: ["loud"])) }
    }

    @Test(arguments: PersistenceBackend.all)
    func fullTextFindsWordsPhrasesAndPrefixes(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [
                Self.line(1, "Connection refused by upstream"),
                Self.line(2, "connection reset; refused later"),
                Self.line(3, "Café opened", metadata: #"{"screen":"checkout"}"#),
                Self.line(4, "authentication failed"),
                Self.line(5, #"quote " and backslash \ in text"#),
            ])
        ])
        #expect(try await messages(index, RecordSearch(text: "connection")) == ["Connection refused by upstream", "connection reset; refused later"])
        #expect(try await messages(index, RecordSearch(text: "\"connection refused\"")) == ["Connection refused by upstream"])
        #expect(try await messages(index, RecordSearch(text: "refused connection")).count == 2, "words, in any order")
        #expect(try await messages(index, RecordSearch(text: "cafe")) == ["Café opened"], "accents and case ignored")
        #expect(try await messages(index, RecordSearch(text: "checkout")) == ["Café opened"], "metadata is searched too")
        #expect(try await messages(index, RecordSearch(text: "auth*")) == ["authentication failed"])
        #expect(try await messages(index, RecordSearch(text: "auth")).isEmpty, "a word is matched whole")
        // The user's quotes, stars and operators are words, never syntax: as FTS5 syntax these
        // would find records; as words (all required) they find none.
        #expect(try await messages(index, RecordSearch(text: "backslash OR connection")).isEmpty)
        #expect(try await messages(index, RecordSearch(text: #"connection NOT reset"#)).isEmpty)
        #expect(try await messages(index, RecordSearch(text: #"quote " OR "connection"#)).isEmpty)
        #expect(try await messages(index, RecordSearch(text: "message : connection")).isEmpty)
        #expect(try await messages(index, RecordSearch(text: "backslash text")) == [#"quote " and backslash \ in text"#])
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(text: "*** \"\"")) }
    }

    /// A uid with text or metadata finds that user's matches only, whatever the uid holds.
    @Test(arguments: PersistenceBackend.all)
    func uidAndTextTogetherFindOnlyThatUsersMatches(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [
                Self.line(1, "zoe declined", uid: "zoë"),
                Self.line(2, "u1 declined", uid: "u-1"),
                Self.line(3, "zoe approved", uid: "zoë"),
                Self.line(4, "ann declined", uid: "ann smith", metadata: #"{"status":503}"#),
                Self.line(5, "ann approved", uid: "ann smith", metadata: #"{"status":200}"#),
                Self.line(6, "nobody declined", uid: ""),
            ]),
            (Self.pull1b, [Self.line(7, "zoe declined elsewhere", uid: "zoë")]),
        ])
        #expect(try await messages(index, RecordSearch(uid: "zoë", text: "declined")) == ["zoe declined", "zoe declined elsewhere"])
        #expect(try await messages(index, RecordSearch(uid: "u-1", text: "declined")) == ["u1 declined"])
        #expect(try await messages(index, RecordSearch(uid: "ann smith", text: "declined")) == ["ann declined"])
        #expect(try await messages(index, RecordSearch(uid: "", text: "declined")) == ["nobody declined"])
        #expect(try await messages(index, RecordSearch(uid: "ann smith", metadata: [MetadataMatch(key: "status", value: "503")])) == ["ann declined"])
        #expect(try await messages(index, RecordSearch(uid: "zoë", metadata: [MetadataMatch(key: "status", value: "503")])).isEmpty)
        #expect(try await messages(index, RecordSearch(uid: "ann", text: "declined")).isEmpty, "a uid is matched whole")
        #expect(try await messages(index, RecordSearch(uid: "zoe", text: "declined")).isEmpty, "a uid is matched exactly")
    }

    @Test(arguments: PersistenceBackend.all)
    func metadataMatchesAMemberExactly(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, [
                Self.line(1, "number", metadata: #"{"http.status":503}"#),
                Self.line(2, "string", metadata: #"{"http.status":"503"}"#),
                Self.line(3, "other value", metadata: #"{"http.status":200,"note":"http status 503"}"#),
                Self.line(4, "nested", metadata: #"{"http":{"status":503}}"#),
                Self.line(5, "event", metadata: #"{"event":"userLoggedIn","ok":true,"gone":null,"ratio":1.5}"#),
                Self.line(6, "case", metadata: #"{"event":"USERLOGGEDIN"}"#),
                Self.line(7, "escaped", metadata: #"{"k":"v","note":"line1\nline2 \"quoted\""}"#),
                Self.line(8, "huge", metadata: #"{"big":1e400}"#),
            ])
        ])
        // A number JSON readers take as infinity: found, its metadata shown as written.
        let huge = try await index.search(RecordSearch(text: "huge")).records
        #expect(huge.map(\.metadata.value) == [.string(#"{"big":1e400}"#)])
        // Values written with escapes are matched exactly, and their record's other members too.
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "note", value: "line1\nline2 \"quoted\"")])) == ["escaped"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "k", value: "v")])) == ["escaped"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "http.status", value: "503")])) == ["number", "string"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "event", value: "userLoggedIn")])) == ["event"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "ok", value: "true")])) == ["event"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "gone", value: "null")])) == ["event"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "ratio", value: "1.5")])) == ["event"])
        #expect(try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "ok", value: "false")])).isEmpty)
        #expect(
            try await messages(index, RecordSearch(metadata: [MetadataMatch(key: "event", value: "userLoggedIn"), MetadataMatch(key: "ok", value: "true")]))
                == ["event"])
        #expect(try await messages(index, RecordSearch(text: "number", metadata: [MetadataMatch(key: "http.status", value: "503")])) == ["number"])
        #expect(MetadataMatch(parsing: "a=b=c") == MetadataMatch(key: "a", value: "b=c"))
        #expect(MetadataMatch(parsing: "=b") == nil && MetadataMatch(parsing: "ab") == nil)
    }

    @Test(arguments: PersistenceBackend.all)
    func pagesFollowEachOtherWithoutGapsOrRepeats(_ backend: PersistenceBackend) async throws {
        // 25 records, many at the same instant: the cursor orders by time, then arrival.
        let lines = (0..<25).map { Self.line($0 / 4, "r\($0)") }
        let index = try await indexed(backend, [(Self.pull1, Array(lines.reversed()))])
        var seen: [String] = []
        var search = RecordSearch(limit: 7)
        var pages = 0
        while true {
            let page = try await index.search(search)
            pages += 1
            seen += page.records.map(\.message)
            guard let next = page.next else { break }
            search.after = next
        }
        #expect(pages == 4)
        #expect(seen.count == 25 && Set(seen).count == 25)
        let times = try await index.search(RecordSearch(limit: 100)).records.map(\.ts)
        #expect(times == times.sorted())
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(after: "nonsense")) }
    }

    @Test(arguments: PersistenceBackend.all)
    func idsAreNeverReusedSoFollowersMissNothing(_ backend: PersistenceBackend) async throws {
        let index = try await backend.records(dir)
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.pull1, lines: Array((Self.line(1, "first try") + "\n" + Self.line(2, "first try too") + "\n").utf8))
        let seen = try await index.search(RecordSearch())
        #expect(seen.newestID == seen.records.map(\.id).max())
        // Started over (a crash, a failure): its rows go, and what comes next gets new ids.
        try await index.begin(Self.pull1, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.pull1, lines: Array((Self.line(1, "again") + "\n").utf8))
        #expect(try await messages(index, RecordSearch(arrivedAfter: seen.newestID)) == ["again"])
    }

    @Test(arguments: PersistenceBackend.all)
    func arrivedAfterReturnsOnlyLaterArrivals(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [(Self.pull1, [Self.line(9, "early arrival")])])
        let last = try #require(try await index.search(RecordSearch()).records.last?.id)
        try await index.begin(Self.feedback2, contexts: Self.contexts, landedAt: Date())
        _ = try await index.add(Self.feedback2, lines: Array((Self.line(1, "late arrival, older record") + "\n").utf8))
        #expect(try await messages(index, RecordSearch(arrivedAfter: last)) == ["late arrival, older record"])
        #expect(try await messages(index, RecordSearch(text: "arrival", arrivedAfter: 0)) == ["early arrival", "late arrival, older record"])
        #expect(try await messages(index, RecordSearch(uid: "u-1", feedback: Self.id(2), arrivedAfter: last)) == ["late arrival, older record"])
        #expect(try await messages(index, RecordSearch(uid: "u-1", pull: Self.id(1), arrivedAfter: 0)) == ["early arrival"])
        #expect(try await messages(index, RecordSearch(pull: Self.id(1), arrivedAfter: last)).isEmpty)
    }
    @Test(arguments: PersistenceBackend.all)
    func pagesReadBackwardsMeetThePagesReadForwards(_ backend: PersistenceBackend) async throws {
        let lines = (0..<25).map { Self.line($0 / 4, "r\($0)") }
        let index = try await indexed(backend, [(Self.pull1, Array(lines.reversed())), (Self.feedback2, [Self.line(3, "other source", level: "error")])])
        var forward: [[String]] = []
        var search = RecordSearch(pull: Self.id(1), limit: 7)
        var last = try await index.search(search)
        #expect(last.previous == nil, "the first page has none before it")
        forward.append(last.records.map(\.message))
        while let next = last.next {
            search.after = next
            last = try await index.search(search)
            forward.append(last.records.map(\.message))
        }
        #expect(forward.count == 4)
        // From the last page back to the first, through `previous`: the same pages' records.
        var backward: [[String]] = []
        var page = last
        while let previous = page.previous {
            page = try await index.search(RecordSearch(pull: Self.id(1), before: previous, limit: 7))
            backward.append(page.records.map(\.message))
            #expect(page.next != nil, "a page read backwards continues forwards")
        }
        #expect(backward.flatMap { $0 }.count == 21 && Array(backward.reversed().joined()) == Array(forward.dropLast().joined()))
        #expect(backward.count == 3 && page.previous == nil, "the earliest page is the first")
        // A moment: the records before it, then forwards from it.
        let moment = "\(Self.at(3).microseconds).0"
        let before = try await index.search(RecordSearch(pull: Self.id(1), before: moment, limit: 5))
        #expect(before.records.map(\.ts).allSatisfy { $0 < Self.at(3) } && before.records.count == 5 && before.previous != nil)
        let from = try await index.search(RecordSearch(pull: Self.id(1), after: try #require(before.next), limit: 100))
        #expect(from.records.count == 13 && from.records.first?.ts == Self.at(3))
        let none = try await index.search(RecordSearch(pull: Self.id(1), before: "\(Self.at(0).microseconds).0"))
        #expect(none.records.isEmpty && none.previous == nil)
        #expect(try await index.search(RecordSearch(pull: Self.id(1), after: try #require(none.next))).records.count == 25)
        // The latest page: nothing after it, so no next; past the end, the page before it is named.
        let latest = try await index.search(RecordSearch(pull: Self.id(1), before: "\(Int64.max).0", limit: 10))
        #expect(latest.records.count == 10 && latest.next == nil && latest.previous != nil)
        let past = try await index.search(RecordSearch(pull: Self.id(1), after: "\(Self.at(99).microseconds).5"))
        #expect(past.records.isEmpty && past.next == nil)
        #expect(try await index.search(RecordSearch(pull: Self.id(1), before: try #require(past.previous), limit: 100)).records.count == 25)
        let nothingBefore = try await index.search(RecordSearch(pull: Self.id(1), after: "0.0", limit: 100))
        #expect(nothingBefore.records.count == 25 && nothingBefore.previous != nil, "a page after a cursor names the page before it")
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(before: "1.-2")) }
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(after: "1.1", before: "2.2")) }
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(before: "x.1")) }
        await #expect(throws: RecordSearchError.self) { try await index.search(RecordSearch(before: "1.1", arrivedAfter: 0)) }
    }

    @Test(arguments: PersistenceBackend.all)
    func aRecordComesWithItsNeighboursFromTheSameSource(_ backend: PersistenceBackend) async throws {
        let index = try await indexed(backend, [
            (Self.pull1, (0..<30).map { Self.line($0 / 2, "a\($0)") }),
            (Self.pull1b, (0..<30).map { Self.line($0, "b\($0)") }),
        ])
        // A pull from two devices: one timeline, forwards and backwards; a pull and a feedback at once: nothing.
        let merged = try await index.search(RecordSearch(pull: Self.id(1), limit: 100)).records
        #expect(merged.count == 60 && merged.map(\.ts) == merged.map(\.ts).sorted() && Set(merged.map(\.agentID)).count == 2)
        #expect(try await index.search(RecordSearch(pull: Self.id(1), before: "\(Int64.max).0", limit: 100)).records == merged)
        // Paged, forwards then backwards, ties at one instant across devices included: the same timeline.
        var forwards: [FoundRecord] = [], cursor: String? = nil
        repeat {
            let page = try await index.search(RecordSearch(pull: Self.id(1), after: cursor, limit: 7))
            forwards += page.records
            cursor = page.next
        } while cursor != nil
        #expect(forwards == merged)
        var backwards: [FoundRecord] = [], before: String? = "\(Int64.max).0"
        while let at = before {
            let page = try await index.search(RecordSearch(pull: Self.id(1), before: at, limit: 7))
            backwards = page.records + backwards
            before = page.previous
        }
        #expect(backwards == merged)
        let errors = try await index.search(RecordSearch(pull: Self.id(1), levels: ["error"])).records
        #expect(errors.isEmpty, "the other filters apply to each device's part")
        #expect(try await index.search(RecordSearch(pull: Self.id(1), feedback: Self.id(2))).records.isEmpty)
        #expect(try await index.search(RecordSearch(pull: Self.id(9))).records.isEmpty)
        let all = try await index.search(RecordSearch(agents: [Self.agentA], pull: Self.id(1), limit: 100)).records
        let middle = all[10]
        let found = try #require(try await index.record(middle.id, context: 3))
        #expect(found.record == middle)
        #expect(found.before.map(\.message) == ["a7", "a8", "a9"] && found.after.map(\.message) == ["a11", "a12", "a13"])
        let first = try #require(try await index.record(all[0].id, context: 5))
        #expect(first.before.isEmpty && first.after.map(\.message) == ["a1", "a2", "a3", "a4", "a5"])
        let bare = try #require(try await index.record(all[29].id, context: 0))
        #expect(bare.before.isEmpty && bare.after.isEmpty && bare.record.message == "a29")
        #expect(try await index.record(999_999, context: 3) == nil)
        // At most 200 each side, whatever is asked.
        let long = try await indexed(backend, [(Self.feedback2, (0..<450).map { Self.line($0, "f\($0)") })])
        let far = try await long.search(RecordSearch(feedback: Self.id(2), limit: 500)).records
        let capped = try #require(try await long.record(far[225].id, context: 10_000))
        #expect(capped.before.count == 200 && capped.after.count == 200 && capped.before.first?.message == "f25" && capped.after.last?.message == "f425")
    }
}

