import DredgeCommandLine

/// Every `print` of this tool goes through here: what it prints for a person may hold text an
/// agent chose, so control characters are shown escaped (``Terminal``). `--json` output is
/// printed by `printJSON`, exact.
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    Swift.print(Terminal.visible(items.map { "\($0)" }.joined(separator: separator)), terminator: terminator)
}
