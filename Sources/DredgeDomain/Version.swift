/// Dredge's release, as `--version` on every binary prints it.
public enum DredgeVersion {
    public static let current = "0.2.0"
}
