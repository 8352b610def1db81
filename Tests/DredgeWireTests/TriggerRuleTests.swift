import DredgeDomain
import DredgeWire
import Foundation
import Testing

/// The terms of a trigger and of a set (README § 21): each rule refuses on its own, and what
/// passes reads back to the same wire form.
@Suite struct TriggerRuleTests {
    static let valid = WireTrigger.with {
        $0.triggerID = "7a0b1c2d3e4f50617283940a1b2c3d4e"
        $0.name = "payment declined"
        $0.match = .with { $0.levels = [.error, .critical]; $0.types = ["business"]; $0.text = "declined"; $0.metadataKey = "code"; $0.metadataValue = "51" }
        $0.uid = "u-1"
        $0.app = "shop"
        $0.minAppVersion = "2.0"
        $0.maxAppVersion = "2.10"
        $0.beforeS = 300
        $0.afterS = 60
        $0.maxPerDeviceDay = 3
        $0.expiresAtUs = 1_795_945_200_000_000
    }

    @Test func aValidTriggerReadsBackToItsWireForm() throws {
        let rule = try TriggerRule(wire: Self.valid)
        #expect(rule.match?.levels == [.error, .critical])
        #expect(rule.match?.metadataValue == "51")
        #expect(rule.uid == "u-1")
        // The wire form lists levels ascending and types by bytes, whatever order they came in.
        var unsorted = Self.valid
        unsorted.match.levels = [.critical, .warning, .error]
        unsorted.match.types = ["network", "business", "app"]
        let sorted = try TriggerRule(wire: unsorted).wire
        #expect(sorted.match.levels == [.warning, .error, .critical] && sorted.match.types == ["app", "business", "network"])
        #expect(rule.wire.match.levels == [.error, .critical])
        #expect(try TriggerRule(wire: rule.wire) == rule)
    }

    @Test func eachRuleRefusesOnItsOwn() {
        let cases: [(String, (inout WireTrigger) -> Void, String)] = [
        ("an id not of the §5 form", { (t: inout WireTrigger) in t.triggerID = "7A0B1C2D3E4F50617283940A1B2C3D4E" }, "32 lowercase hex"),
        ("an empty name", { $0.name = "" }, "a name is 1 to"),
        ("a name too long", { $0.name = String(repeating: "n", count: 257) }, "a name is 1 to"),
        ("a NUL in the name", { $0.name = "a\u{0}b" }, "a name is 1 to"),
        ("an unknown level", { $0.match.levels = [WireLevel(rawValue: 9)!] }, "unknown level 9"),
        ("a type that is not a name", { $0.match.types = ["Not A Type"] }, "is not a type name"),
        ("a text too long", { $0.match.text = String(repeating: "t", count: 1_025) }, "a text is at most"),
        ("an empty metadata member name", { $0.match.metadataKey = "" }, "a metadata member's name"),
        ("a value without a member", { $0.match.clearMetadataKey() }, "needs the member's name"),
        ("a NUL in the value", { $0.match.metadataValue = "5\u{0}1" }, "a metadata value is at most"),
        ("nothing fires it", { $0.clearMatch(); $0.crash = false }, "nothing fires it"),
        ("a bad uid", { $0.uid = String(repeating: "u", count: 300) }, "uid:"),
        ("an app too long", { $0.app = String(repeating: "a", count: 257) }, "an app name"),
        ("a version bound too long", { $0.maxAppVersion = String(repeating: "9", count: 65) }, "an app version bound"),
        ("bounds the wrong way round", { $0.minAppVersion = "2.11" }, "the lowest app version is above the highest"),
        ("a window too long before", { $0.beforeS = 3_601 }, "a window is at most"),
        ("a window too long after", { $0.afterS = 601 }, "a window is at most"),
        ("no captures a day", { $0.maxPerDeviceDay = 0 }, "captures per device and day"),
        ("too many captures a day", { $0.maxPerDeviceDay = 101 }, "captures per device and day"),
        ("an expiry out of range", { $0.expiresAtUs = -1 }, "expires_at_us"),
        ]
        for (what, change, says) in cases {
            var trigger = Self.valid
            change(&trigger)
            let error = #expect(throws: TriggerRule.Invalid.self, "\(what)") { try TriggerRule(wire: trigger) }
            #expect(error?.description.contains(says) == true, "\(what): \(error?.description ?? "")")
        }
    }

    @Test func aCrashTriggerNeedsNoMatchAndAnEmptyTextIsNoTest() throws {
        var crashOnly = Self.valid
        crashOnly.clearMatch()
        crashOnly.crash = true
        let rule = try TriggerRule(wire: crashOnly)
        #expect(rule.match == nil)
        #expect(!rule.fires(on: MatchableRecord(level: .critical, type: "business", uid: "u-1", message: "declined", metadata: nil, app: "shop", appVersion: "2.1")))
        #expect(rule.fires(onCrashOf: "u-1", app: "shop", appVersion: "2.1"))
        #expect(!rule.fires(onCrashOf: "u-1", app: "shop", appVersion: "3"), "out of the version bounds")
        // A match present with no condition would fire on every record: refused, whatever else is set.
        for empty in [WireTriggerMatch(), .with { $0.text = "" }, .with { $0.levels = []; $0.types = [] }] {
            var trigger = Self.valid
            trigger.match = empty
            trigger.crash = true
            #expect(throws: TriggerRule.Invalid.self) { try TriggerRule(wire: trigger) }
        }
        var textOnly = Self.valid
        textOnly.match = .with { $0.text = "x" }
        #expect(try TriggerRule(wire: textOnly).match == TriggerRule.Match(text: "x"))
    }

    @Test func aSetIsCheckedAsAWhole() throws {
        var set = WireTriggerSet.with { $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"; $0.version = 1; $0.issuedAtUs = 1_795_340_400_000_000 }
        #expect(try TriggerSetTerms.check(set).isEmpty, "an empty set clears the agent's triggers")
        var never = set
        never.version = 0
        #expect(try TriggerSetTerms.check(never).isEmpty, "a server that never had a trigger sends an empty set of version 0")
        set.triggers = [Self.valid]
        #expect(try TriggerSetTerms.check(set).count == 1)
        var twice = set
        twice.triggers = [Self.valid, Self.valid]
        #expect(throws: TriggerRule.Invalid.self) { try TriggerSetTerms.check(twice) }
        var unversioned = set
        unversioned.version = 0
        unversioned.triggers = [Self.valid]
        #expect(throws: TriggerRule.Invalid.self) { try TriggerSetTerms.check(unversioned) }
        var tooMany = set
        tooMany.triggers = (0..<65).map { i in
            var t = Self.valid
            t.triggerID = String(format: "%032x", i)
            return t
        }
        #expect(throws: TriggerRule.Invalid.self) { try TriggerSetTerms.check(tooMany) }
        tooMany.triggers.removeLast()
        #expect(try TriggerSetTerms.check(tooMany).count == 64)
        var broken = set
        broken.triggers.append(.with { $0.triggerID = "bad" })
        #expect(throws: TriggerRule.Invalid.self) { try TriggerSetTerms.check(broken) }
    }

    /// A level no peer knows (a negative enum number on the wire) is written as its 32 bits in
    /// a signing input, never a trap: the terms refuse it after the signature is checked.
    @Test func anUnknownLevelNeverTrapsASigningInput() throws {
        let unknown = try #require(WireLevel(rawValue: -1))
        let set = WireTriggerSet.with { $0.triggers = [.with { $0.match = .with { $0.levels = [unknown] } }] }
        #expect(SigningInput.triggerSet(set).contains([0xFF, 0xFF, 0xFF, 0xFF]))
        #expect(SigningInput.pullCommand(.with { $0.filter.levels = [unknown] }).count > 0)
        #expect(SigningInput.tailCommand(.with { $0.filter.levels = [unknown] }).count > 0)
        #expect(throws: TriggerRule.Invalid.self) { try TriggerSetTerms.check(set) }
    }

    @Test func theTextRuleFoldsASCIIOnly() {
        #expect(TextRule.contains("Payment DECLINED", "payment declined"))
        #expect(TextRule.contains("anything", ""))
        #expect(!TextRule.contains("", "a"))
        #expect(!TextRule.contains("ÉCOLE", "école"), "no Unicode case folding")
        #expect(TextRule.contains("the end", "end"))
        #expect(!TextRule.contains("the en", "end"))
        #expect(TextRule.contains("[@]", "[@]"), "bytes next to the letters are not folded")
        #expect(!TextRule.contains("`", "@"))
    }

    @Test func aMetadataMemberIsReadFromTheTopLevelOfAWellFormedObject() {
        #expect(MetadataMember.holds(#"{"a":1,"b":"x"}"#, key: "b", value: "x"))
        #expect(MetadataMember.holds(#"{"a":1,"b":"x"}"#, key: "a", value: nil))
        #expect(!MetadataMember.holds(#"{"a":1,"b":"x"}"#, key: "c", value: nil))
        #expect(MetadataMember.holds(#"{"s":"a\"b"}"#, key: "s", value: "a\"b"), "escapes undone")
        #expect(!MetadataMember.holds(#"{"s":"a\"b"}"#, key: "s", value: #"a\"b"#))
        #expect(!MetadataMember.holds(#"{"a":1,"b":"x""#, key: "a", value: "1"), "not well formed: nothing matches")
        #expect(!MetadataMember.holds(#"["a",1]"#, key: "a", value: nil), "not an object")
        #expect(!MetadataMember.holds("", key: "a", value: nil))
        #expect(MetadataMember.holds(#"{"o":{"x":[1,2]}}"#, key: "o", value: #"{"x":[1,2]}"#))
        #expect(!MetadataMember.holds(#"{"o":{"x":[1,2]}}"#, key: "x", value: nil), "not at the top level")
        #expect(!MetadataMember.holds(#"{"a":1} {"b":2}"#, key: "a", value: nil), "nothing after the object")
        #expect(MetadataMember.holds(" {\n\"a\" :\t1 } ", key: "a", value: "1"), "space around it")
        let deep = String(repeating: "[", count: 70) + String(repeating: "]", count: 70)
        #expect(!MetadataMember.holds("{\"a\":1,\"d\":\(deep)}", key: "a", value: "1"), "nested deeper than 64: not well formed")
    }
}
