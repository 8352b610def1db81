#!/usr/bin/env python3
"""Polite uploads over a link the kernel shapes (#54).

    python3 Tests/polite/shaped_link.py BIN_DIR [--figure]

A real dredge-server on the host, and a real dredge-agent in a network namespace of its own
whose only link to the server is a veth pair shaped by tc (a token bucket at 2 Mbit/s):
the device's uplink. The device's upload policy wants an unmetered network and at most
96 KiB a second. Then:

1. the network is metered: a user's feedback waits in the outbox; the agent says why and the
   server hears nothing of it;
2. the network turns unmetered: the upload goes, at the cap;
3. metered again in the middle: it stops (no chunk crosses the link for two heartbeats);
4. unmetered again: it resumes where it stopped and lands whole.

The rate is what crossed the link (the host end's received bytes: frames, TLS, TCP, IP and
Ethernet headers, which the agent's cap counts) while the upload was going, and it must be
within 10 % of the cap. With --figure it prints the `upload.politeness` figure as JSON (that
rate over the cap, and the payload's) for dredge-bench.

Needs root (ip netns, tc). Sends nothing anywhere but its own namespace and loopback.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

CAP = 96 * 1024            # the policy's bytes a second
LINK = "2mbit"             # the shaped uplink: well above the cap, so the cap is what shows
RECORDS = 9_000            # records of 140 random bytes each (in hex): a zip of ~20 chunks of 64 KiB


def fail(message):
    raise SystemExit(f"shaped_link: FAIL: {message}")


def run(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def wait(what, check, timeout=120.0, every=0.1):
    """Returns `check()`'s first true value; a passing failure of the admin API (a timeout, a
    5xx on a loaded machine) is looked at again, not the end of the run."""
    end = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < end:
        try:
            value = check()
        except urllib.error.HTTPError as e:
            if e.code < 500:
                raise
            value, last_error = None, e
        except (OSError, TimeoutError) as e:
            value, last_error = None, e
        if value:
            return value
        time.sleep(every)
    fail(f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Link:
    """A namespace for the device and a shaped veth pair to it."""

    def __init__(self):
        self.sampling = False
        self.ns = self.host_dev = None
        Link.remove_leftovers()
        # A name and a /30 no other run uses now (their routes would clash).
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout if shutil.which("ip") else ""
        for _ in range(50):
            tag = f"{os.getpid()}-{random.randrange(1 << 16):04x}"
            n = random.randrange(1, 255)
            if f"10.213.{n}." not in routes:
                break
        suffix = tag.replace("-", "")[-9:]
        host_dev, self.device_dev = f"dp{suffix}h", f"dp{suffix}d"
        self.host_ip, self.device_ip = f"10.213.{n}.1", f"10.213.{n}.2"
        try:
            run("ip", "netns", "add", f"dredge-polite-{tag}")
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            fail(f"cannot make a network namespace (this test needs root and iproute2): {getattr(e, 'stderr', e)}")
        self.ns = f"dredge-polite-{tag}"
        self.host_dev = host_dev
        try:
            self.connect()
        except BaseException:
            self.close()
            raise

    def connect(self):
        run("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", self.device_dev)
        run("ip", "link", "set", self.device_dev, "netns", self.ns)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
        run("ip", "link", "set", self.host_dev, "up")
        self.inside("ip", "addr", "add", f"{self.device_ip}/30", "dev", self.device_dev)
        self.inside("ip", "link", "set", self.device_dev, "up")
        self.inside("ip", "link", "set", "lo", "up")
        # The device's uplink: a token bucket at LINK (the kernel's, not the sender's).
        self.inside("tc", "qdisc", "add", "dev", self.device_dev, "root", "tbf", "rate", LINK, "burst", "16kb", "latency", "400ms")

    def inside(self, *args):
        return run("ip", "netns", "exec", self.ns, *args)

    @staticmethod
    def remove_leftovers():
        """Namespaces of runs whose process is gone (killed before they could clean up)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout if shutil.which("ip") else ""
        for line in listed.splitlines():
            name = line.split()[0] if line.split() else ""
            m = re.fullmatch(r"dredge-polite-(\d+)-[0-9a-f]{4}", name)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def uplink_bytes(self):
        """Bytes the host end received from the device: what crossed the uplink."""
        with open(f"/sys/class/net/{self.host_dev}/statistics/rx_bytes") as f:
            return int(f.read())

    def start_sampling(self):
        """Samples the uplink's byte counter every 50 ms, in the background."""
        self.samples, self.sampling = [], True

        def sample():
            while self.sampling:
                self.samples.append((time.monotonic(), self.uplink_bytes()))
                time.sleep(0.05)
        self.sampler = threading.Thread(target=sample, daemon=True)
        self.sampler.start()

    def quiet(self, seconds=2.0, most=4096):
        """True when at most `most` bytes crossed the uplink in the last `seconds` (samples
        that cover the whole stretch, however late the sampler ran)."""
        now = time.monotonic()
        samples = list(self.samples)
        window = [(t, b) for t, b in samples if t >= now - seconds]
        before = [(t, b) for t, b in samples if t < now - seconds]
        if not before or not window:
            return False
        first = before[-1]
        return now - window[-1][0] < 0.5 and window[-1][1] - first[1] <= most

    def sending_rate(self, since):
        """The sustained rate, bytes a second, of the upload after `since`: the least-squares
        slope of the byte counter over the stretch in which it crossed the link (from the
        sample before it first rose 2 KB to the last that grew). A paced upload is a
        staircase, a chunk at the link's speed then a pause; the slope is its steps' rate,
        whichever step the stretch begins and ends on."""
        samples = [(t, b) for t, b in list(self.samples) if t >= since]
        if len(samples) < 3:
            fail("too few samples of the link to measure a rate")
        base = samples[0][1]
        first = next((i for i, (_, b) in enumerate(samples) if b > base + 2048), None)
        if first is None:
            fail("the upload never crossed the link")
        start = max(0, first - 1)
        # Growth of a chunk, not of a heartbeat and its acknowledgement (a few hundred bytes).
        end = max(i for i in range(1, len(samples)) if i <= start + 1 or samples[i][1] > samples[i - 1][1] + 2048)
        stretch = samples[start:end + 1]
        n = len(stretch)
        mt = sum(t for t, _ in stretch) / n
        mb = sum(b for _, b in stretch) / n
        slope = sum((t - mt) * (b - mb) for t, b in stretch) / sum((t - mt) ** 2 for t, _ in stretch)
        return slope, stretch[-1][1] - stretch[0][1], stretch[-1][0] - stretch[0][0]

    def close(self):
        self.sampling = False
        if getattr(self, "ns", None):
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        if getattr(self, "host_dev", None):
            subprocess.run(["ip", "link", "del", self.host_dev], capture_output=True)


def bytes_before_hold(link, since):
    samples = [b for t, b in list(link.samples) if t >= since]
    return samples[-1] - samples[0] if samples else 0


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    # Killed (a timeout, Ctrl-C): the namespace, the link and the processes are removed all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("shaped_link: terminated"))
    bin_dir = os.path.abspath(sys.argv[1])
    figure = "--figure" in sys.argv[2:]
    work = tempfile.mkdtemp(prefix="dredge-polite-")
    processes = []
    link = None
    try:
        link = Link()
        data = os.path.join(work, "server")
        agent_port, admin_port = free_port(), free_port()
        init = run(f"{bin_dir}/dredge-server", "init", "--data", data, "--listen", f"{link.host_ip}:{agent_port}", "--name", link.host_ip).stdout
        words = init.split()
        enrollment = next(w for w in words if w.startswith("dredge_enr_"))
        admin_token = next(w for w in words if w.startswith("dredge_adm_"))
        # Heartbeats every second, and room for a loaded machine's stalls before a connection is given up.
        with open(os.path.join(data, "server.json")) as f:
            config = json.load(f)
        config["connections"] = {"missedHeartbeats": 30, "handshakeSeconds": 120}
        with open(os.path.join(data, "server.json"), "w") as f:
            json.dump(config, f)
        server_log = open(os.path.join(work, "server.log"), "w")
        processes.append(subprocess.Popen(
            [f"{bin_dir}/dredge-server", "run", "--data", data, "--agent-port", str(agent_port), "--admin-port", str(admin_port), "--heartbeat-seconds", "1"],
            stdout=server_log, stderr=server_log, start_new_session=True))
        tls = ssl.create_default_context(cafile=os.path.join(data, "ca.pem"))

        def api(path):
            request = urllib.request.Request(f"https://127.0.0.1:{admin_port}{path}", headers={"Authorization": f"Bearer {admin_token}"})
            with urllib.request.urlopen(request, context=tls, timeout=30) as answer:
                return json.load(answer)

        def feedback(fid):
            try:
                return api(f"/v1/feedback/{fid}?disk=false")
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                raise

        def served():
            try:
                return api("/health")["status"] == "ok"
            except OSError:
                return False

        wait("the server", served)

        # The device: a store of records that do not compress, an enrolled agent, its policy.
        device = os.path.join(work, "device")
        os.makedirs(device)
        store, state = os.path.join(device, "logs.sqlite"), os.path.join(device, "agent")
        lines = "\n".join(random.randbytes(210).hex()[:280] + f" #{i}" for i in range(RECORDS)) + "\n"
        run(f"{bin_dir}/dredge-agent", "ingest", "--store", store, "--uid", "u-1", "--type", "business", "--app", "oven", input=lines)
        agent = [f"{bin_dir}/dredge-agent"]
        link.inside(*agent, "enroll", "--state", state, "--server", f"{link.host_ip}:{agent_port}", "--ca", os.path.join(data, "ca.pem"),
                    "--token", enrollment, "--app", "oven")
        run(*agent, "policy", "set", "--state", state, "--unmetered-only", "true", "--max-rate", str(CAP))
        run(*agent, "network", "metered", "--state", state)
        agent_log_path = os.path.join(device, "agent.log")
        agent_log = open(agent_log_path, "w")
        processes.append(subprocess.Popen(["ip", "netns", "exec", link.ns, *agent, "run", "--state", state, "--store", store, "--app", "oven"],
                                          stdout=agent_log, stderr=agent_log, start_new_session=True))

        def log():
            with open(agent_log_path) as f:
                return f.read()

        wait("the agent online", lambda: any(a["connected"] for a in api("/v1/agents")))
        link.start_sampling()

        # 1. Metered: the feedback waits, and the agent says why.
        fid = run(*agent, "feedback", "--state", state, "--store", store, "--uid", "u-1", "--text", "the oven turns itself off", "--days", "1").stdout.strip()
        wait("the agent to hold the upload", lambda: "uploads held by the device's upload policy" in log() and "the network is metered" in log())
        wait("a quiet link", link.quiet, timeout=30)
        if feedback(fid) is not None:
            fail("the server heard of the feedback while the network was metered")
        print("metered: the feedback waits in the outbox; the server has nothing of it")

        # 2. Unmetered: it goes at the cap.
        resumed, resumed_bytes = time.monotonic(), link.uplink_bytes()
        run(*agent, "network", "unmetered", "--state", state)
        record = wait("the upload to begin", lambda: feedback(fid))
        chunk_count = record["chunkCount"]
        if chunk_count < 15:
            fail(f"the upload has {chunk_count} chunks: too few to measure a rate")
        # Half-way by what crossed the link (the server records its chunks 16 at a time).
        expected = chunk_count * 65_536 * 1.05
        wait("half the upload", lambda: link.uplink_bytes() - resumed_bytes >= expected / 2, timeout=120)

        # 3. Metered again: the agent stops sending. (If it did not, the link would never go quiet.)
        run(*agent, "network", "metered", "--state", state)
        wait("the agent to hold the upload again", lambda: log().count("uploads held by the device's upload policy") >= 2)
        wait("a quiet link while metered", link.quiet, timeout=30)
        first_stretch = link.sending_rate(resumed)
        held_bytes, quiet_since = link.uplink_bytes(), time.monotonic()
        wait("another quiet stretch", lambda: time.monotonic() > quiet_since + 2 and link.quiet(), timeout=30)
        after = feedback(fid)
        crossed = link.uplink_bytes() - held_bytes
        if after["status"] != "uploading" or crossed > 8192:
            fail(f"the upload went on while metered: {crossed} bytes crossed, it is {after['status']}")
        print(f"metered again after {bytes_before_hold(link, resumed)} bytes: the link went quiet and stayed so ({crossed} bytes of heartbeats)")

        # 4. Unmetered again: it resumes and lands whole.
        resumed = time.monotonic()
        run(*agent, "network", "unmetered", "--state", state)
        done = wait("the feedback to land", lambda: (lambda r: r if r and r["status"] == "complete" else None)(feedback(fid)), timeout=180)
        wait("the link to settle", link.quiet, timeout=30)
        second_stretch = link.sending_rate(resumed)
        if done["records"] != RECORDS + 1:
            fail(f"{done['records']} records landed, not {RECORDS + 1} (the user's and the feedback's own)")
        # The agent's own count of the day's bytes against what the upload carried.
        policy = json.loads(run(*agent, "policy", "show", "--state", state, "--json").stdout)
        # The two stretches' rates, weighted by their bytes.
        (rate1, bytes1, seconds1), (rate2, bytes2, seconds2) = first_stretch, second_stretch
        wire_rate = (rate1 * bytes1 + rate2 * bytes2) / (bytes1 + bytes2)
        payload_rate = wire_rate * done["bytes"] / (bytes1 + bytes2)
        seconds = seconds1 + seconds2
        print(f"landed whole: {done['records']} records, {chunk_count} chunks, {done['bytes']} bytes")
        print(f"rate over the shaped link: {wire_rate / 1024:.1f} KiB/s on the wire ({rate1 / 1024:.1f} then {rate2 / 1024:.1f}), "
              f"{payload_rate / 1024:.1f} KiB/s of payload, cap {CAP / 1024:.0f} KiB/s (wire/cap {wire_rate / CAP:.3f}, payload/cap {payload_rate / CAP:.3f}); "
              f"{bytes1 + bytes2} bytes crossed in {seconds:.1f} s; the agent counted {policy['spentToday']} bytes today")
        # Measured while the upload crossed the link: the agent's reaction to the network
        # (within a second) is not counted.
        if not 0.9 <= wire_rate / CAP <= 1.1:
            fail(f"the rate on the link is {wire_rate / CAP:.3f} of the cap, not within 10 %")
        if figure:
            print(json.dumps({"upload.politeness": round(wire_rate / CAP, 3), "payload_over_cap": round(payload_rate / CAP, 3),
                              "seconds": round(seconds, 1), "bytes": done["bytes"]}))
        print("shaped_link: ok")
    finally:
        for p in processes:
            try:
                os.killpg(p.pid, signal.SIGTERM)  # each in a session of its own
            except ProcessLookupError:
                pass
        for p in processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if link:
            link.close()
        if sys.exc_info()[0] is not None:
            # Failed: what the processes said, before their directory goes.
            for name in ("server.log", "device/agent.log"):
                path = os.path.join(work, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        print(f"--- {name} (last lines) ---\n" + "".join(f.readlines()[-40:]), file=sys.stderr)
        if os.environ.get("KEEP_WORK"):
            print("work kept in", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
