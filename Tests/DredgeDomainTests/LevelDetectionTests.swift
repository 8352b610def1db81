import DredgeDomain
import Testing

@Suite struct LevelDetectionTests {
    @Test(arguments: [
        ("<11>Nov 22 09:00:00 host app[1]: disk failing", LogLevel.error),
        ("<12>warning via syslog", .warning),
        ("<2>kernel panic", .critical),
        ("<13>notice", .notice),
        ("<14>just info", .info),
        ("<191>debug chatter", .debug),
        (#"{"level":"warn","msg":"slow"}"#, .warning),
        (#"{"severity":"ERROR","message":"x"}"#, .error),
        ("ts=2026-01-01 level=error msg=\"boom\"", .error),
        ("time=1 lvl=debug x", .debug),
        ("2026-11-22 09:00:00 ERROR payment failed", .error),
        ("2026-11-22 09:00:00 WARN slow", .warning),
        ("[warn] cache miss", .warning),
        ("E: nothing", nil),
        ("fatal: not a git repository", .critical),
        ("INFO started", .info),
        ("09:00 [DEBUG] tick", .debug),
        ("SEVERE: out of memory", .critical),
        ("nothing to see here", nil),
        ("an error occurred while loading", nil),
        ("a level word far away: a b c d e f g h i j WARNING", nil),
        ("<999>not a priority", nil),
        ("<>empty", nil),
        ("{not json level=warn", .warning),
        ("", nil),
    ] as [(String, LogLevel?)])
    func aPlainLineStatesItsLevel(line: String, expected: LogLevel?) {
        #expect(LogLevel.detected(inLine: line) == expected, "\(line)")
    }
}
