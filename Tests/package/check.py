#!/usr/bin/env python3
"""`make package`'s tarball, installed into a temporary root and run (#56).

    python3 Tests/package/check.py BIN_DIR
    python3 Tests/package/check.py --tarball dist/dredge-VERSION-linux-ARCH.tar.gz

The first packages the binaries in BIN_DIR with scripts/package.sh (`make test`: the tests'
debug build, the same layout as the release tarball). The second checks a release tarball
itself (`make package` ends with it): its binaries must need no Swift library (`ldd`), and
every installed program runs with the Swift toolchain hidden (an empty file system mounted
over it in a mount namespace of its own, as root), as on a host without Swift. Either way it
checks the SHA-256 file, unpacks the tarball as an operator does (`tar -xzf … -C
ROOT/usr/local --strip-components=1`), and then, from the installed tree alone:

- every file is where the units and `man` look for it; each program says the release's version;
- each program and subcommand has a man page made from its --help, which mandoc renders
  without error (`dredge-server.backup.1` holds the --no-files flag's help);
- the installed units verify and are hardened (Tests/service/check-units.sh on the installed
  units, binaries and sysusers file);
- the installed dredge-server initialises a deployment and runs it; the installed dredge-agent
  enrolls and connects; the installed dredge lists the agent through the admin API; the
  installed dredge-server backs the running deployment up, and `restore --check` finds it whole.

Exits non-zero with what failed.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAILURES = []


def fail(what: str):
    print(f"FAIL: {what}", flush=True)
    FAILURES.append(what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, predicate, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, SystemExit, json.JSONDecodeError):
            pass  # not yet (a command that failed, a server not answering)
        time.sleep(0.25)
    raise SystemExit(f"gave up waiting for {what}")


# The Swift toolchain's directory, hidden from the installed programs when checking a release
# tarball (set in main).
HIDDEN = None


def hiding(args):
    """`args`, run where the Swift toolchain is an empty directory, when one is hidden."""
    if HIDDEN is None:
        return list(args)
    return ["unshare", "--mount", "--", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', HIDDEN] + list(args)


def swift_root():
    """The toolchain's root (/opt/swift for /opt/swift/usr/bin/swift), or None."""
    swift = shutil.which("swift")
    if swift is None:
        return None
    path = os.path.realpath(swift)
    for _ in range(3):
        path = os.path.dirname(path)
    return path if path not in ("/", "/usr") else None


def run(args, **kwargs):
    result = subprocess.run(hiding(args), capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result.stdout


def main():
    global HIDDEN
    if len(sys.argv) == 3 and sys.argv[1] == "--tarball":
        binaries, given = None, os.path.abspath(sys.argv[2])
    elif len(sys.argv) == 2:
        binaries, given = os.path.abspath(sys.argv[1]), None
    else:
        raise SystemExit(__doc__)
    if shutil.which("mandoc") is None:
        raise SystemExit("mandoc is not installed: Debian's mandoc package (make deps installs it)")
    with open(os.path.join(ROOT, "Sources/DredgeDomain/Version.swift")) as f:
        version = re.search(r'static let current = "([^"]+)"', f.read()).group(1)
    work = tempfile.mkdtemp(prefix="dredge-package-")
    processes = []
    try:
        name = f"dredge-{version}-linux-{os.uname().machine}"
        if given is None:
            dist = os.path.join(work, "dist")
            print(run([os.path.join(ROOT, "scripts/package.sh"), "--bin-path", binaries, "--out", dist]).strip())
            tarball = os.path.join(dist, name + ".tar.gz")
        else:
            dist, tarball = os.path.dirname(given), given
            if os.path.basename(given) != name + ".tar.gz":
                fail(f"the tarball is named {os.path.basename(given)}, not {name}.tar.gz (this checkout's release)")
        run(["sha256sum", "--check", "--quiet", name + ".tar.gz.sha256"], cwd=dist)
        listing = run(["tar", "-tzvf", tarball])
        if any(not line.split()[1].startswith("0/0") for line in listing.splitlines()):
            fail("the tarball's files are not owned by 0/0")
        # Unpacked over /usr/local, the archive's directory modes become the system's.
        if any(line.startswith("d") and not line.startswith("drwxr-xr-x") for line in listing.splitlines()):
            fail("the tarball has directories that are not 0755:\n" + "\n".join(l for l in listing.splitlines() if l.startswith("d")))

        # Installed as an operator does.
        prefix = os.path.join(work, "root/usr/local")
        os.makedirs(prefix)
        run(["tar", "-xzf", tarball, "-C", prefix, "--strip-components=1"])
        installed = {os.path.relpath(os.path.join(d, f), prefix) for d, _, files in os.walk(prefix) for f in files}
        expected = {
            "bin/dredge", "bin/dredge-server", "bin/dredge-agent",
            "lib/systemd/system/dredge-server.service", "lib/systemd/system/dredge-agent.service", "lib/sysusers.d/dredge.conf",
            "share/doc/dredge/README.md", "share/doc/dredge/deployment.md", "share/doc/dredge/monitoring/dredge-dashboard.json",
            "share/man/man1/dredge.1", "share/man/man1/dredge-server.1", "share/man/man1/dredge-agent.1",
            "share/man/man1/dredge-server.backup.1", "share/man/man1/dredge-server.restore.1", "share/man/man1/dredge.pull.1",
        }
        for missing in sorted(expected - installed):
            fail(f"the package installs no {missing}")
        bin_dir = os.path.join(prefix, "bin")
        if given is not None:
            # A release's programs need no Swift library, and run with the toolchain hidden.
            for program in ("dredge", "dredge-server", "dredge-agent"):
                linked = run(["ldd", os.path.join(bin_dir, program)])
                if "libswift" in linked or "not found" in linked or "libFoundation" in linked:
                    fail(f"the installed {program} needs libraries a host without Swift lacks:\n{linked}")
            hidden = swift_root()
            if hidden and os.geteuid() == 0 and subprocess.run(["unshare", "--mount", "--", "true"], capture_output=True).returncode == 0:
                HIDDEN = hidden
                print(f"the installed programs run with {hidden} hidden")
            else:
                print(f"note: the Swift toolchain ({hidden}) cannot be hidden here (not root, or no mount namespaces): ldd alone says the programs need none of it")
        for program in ("dredge", "dredge-server", "dredge-agent"):
            said = run([os.path.join(bin_dir, program), "--version"]).strip()
            if said != version:
                fail(f"the installed {program} says version {said!r}, not {version!r}")

        # Man pages, from the commands' help.
        pages = sorted(p for p in installed if p.startswith("share/man/man1/"))
        for page in pages:
            rendered = subprocess.run(["mandoc", "-T", "utf8", "-W", "error", os.path.join(prefix, page)], capture_output=True, text=True)
            if rendered.returncode != 0 or not rendered.stdout.strip():
                fail(f"mandoc cannot render {page}: {rendered.stderr.strip()}")
        backup_page = run(["mandoc", "-T", "utf8", os.path.join(prefix, "share/man/man1/dredge-server.backup.1")])
        if "--no-files" not in re.sub(r".\x08", "", backup_page):
            fail("dredge-server.backup.1 does not describe --no-files")
        print(f"{len(pages)} man pages render")

        # The installed units, binaries and users' file.
        print(run([os.path.join(ROOT, "Tests/service/check-units.sh"), bin_dir, os.path.join(prefix, "lib/systemd/system"),
                   os.path.join(prefix, "lib/sysusers.d/dredge.conf")]).strip())

        # The installed programs, together.
        data = os.path.join(work, "root/var/lib/dredge")
        agent_port, admin_port = free_port(), free_port()
        created = run([os.path.join(bin_dir, "dredge-server"), "init", "--data", data, "--admin-plain-http"])
        enrollment = re.search(r"enrollment token:\s+(\S+)", created).group(1)
        lines = created.splitlines()
        admin_token = lines[next(i for i, line in enumerate(lines) if line.strip().startswith("Admin token for engineers")) + 1].strip()
        log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen(hiding([os.path.join(bin_dir, "dredge-server"), "run", "--data", data, "--agent-port", str(agent_port), "--admin-port", str(admin_port)]),
                                  stdout=log, stderr=log)
        processes.append(server)
        admin = f"http://127.0.0.1:{admin_port}"
        wait_for("the server's health", lambda: urllib.request.urlopen(admin + "/health", timeout=5).status == 200)
        state, store = os.path.join(work, "root/var/lib/dredge-agent"), os.path.join(work, "root/var/lib/dredge-agent-logs.sqlite")
        run([os.path.join(bin_dir, "dredge-agent"), "enroll", "--state", state, "--server", f"localhost:{agent_port}", "--ca", os.path.join(data, "ca.pem"),
             "--token", enrollment])
        agent_log = open(os.path.join(work, "agent.log"), "w")
        agent = subprocess.Popen(hiding([os.path.join(bin_dir, "dredge-agent"), "run", "--create", "--state", state, "--store", store]), stdout=agent_log, stderr=agent_log)
        processes.append(agent)
        environment = dict(os.environ, XDG_CONFIG_HOME=os.path.join(work, "config"), DREDGE_SERVER="", DREDGE_TOKEN="", DREDGE_CA="", DREDGE_PROFILE="")
        listed = wait_for("the agent online, as the installed dredge lists it", lambda: [
            a for a in json.loads(run([os.path.join(bin_dir, "dredge"), "agents", "--server", admin, "--token", admin_token, "--json"], env=environment))
            if a.get("connected")])
        print(f"the installed agent is online: {listed[0]['agentID']}")
        backup = os.path.join(work, "backup")
        print(run([os.path.join(bin_dir, "dredge-server"), "backup", "--data", data, "--to", backup]).splitlines()[0])
        print(run([os.path.join(bin_dir, "dredge-server"), "restore", "--from", backup, "--check"]).strip())
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        raise SystemExit(f"{len(FAILURES)} package check(s) failed")
    print("package: installs, runs, man pages and units OK")


if __name__ == "__main__":
    main()
