"""Real DNS servers from Debian (Knot DNS, Knot Resolver, Unbound) in a network namespace with only loopback:
nothing they send can leave it (no recursion to the internet, even by accident)."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SERVER_PACKAGES = {  # binary -> the Debian package that has it (contrib/install-deps.sh installs them)
    "knotd": "knot", "kdig": "knot-dnsutils", "kresd": "knot-resolver", "unbound": "unbound",
    "dnsperf": "dnsperf", "openssl": "openssl", "dnstap": "golang-github-dnstap-golang-dnstap-cli",
}
KNOT_DNSTAP_MODULE = "knot-module-dnstap"


def missing_servers(*binaries):
    """Why tests with these binaries cannot run (a reason for pytest.skip), or None."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "needs root and iproute2 (network namespaces)"
    gone = [f"{b} (package {SERVER_PACKAGES.get(b, b)})" for b in binaries if not shutil.which(b)]
    if "knotd" in binaries and not list(Path("/usr/lib").glob("*/knot/modules-*/dnstap.so")):
        gone.append(f"Knot's mod-dnstap (package {KNOT_DNSTAP_MODULE})")
    if gone:
        return "missing: " + ", ".join(gone) + " (contrib/install-deps.sh installs them)"
    return None


class Netns:
    """A network namespace with only loopback up; its name carries the test process id."""

    def __init__(self, tag):
        self.name = f"dnsprobe-{tag}{os.getpid() % 100000}"

    def up(self):
        self.down()
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True)
        return self

    def down(self):
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def cmd(self, *args):
        """The command line that runs args in the namespace (ip execs it: its pid is the program's)."""
        return ["ip", "netns", "exec", self.name, *map(str, args)]

    def run(self, *args, timeout=60):
        return subprocess.run(self.cmd(*args), capture_output=True, text=True, timeout=timeout)

    def start(self, log, *args):
        """A server in the foreground, its output to the file log."""
        with open(log, "w") as out:
            return subprocess.Popen(self.cmd(*args), stdout=out, stderr=subprocess.STDOUT)

    def kdig(self, server, name, *opts, port=53, qtype="A"):
        """One query (kdig, no retry); its answer's text, or None when none came."""
        proc = self.run("kdig", f"@{server}", "-p", port, name, qtype, *opts, "+timeout=2", "+retry=0", "+short")
        return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def stop_servers(procs, timeout=20):
    """SIGTERM them all at once (each sends STOP and flushes its dnstap), then wait; kill what does not stop."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def make_certificate(directory):
    """A throw-away certificate for DoT and DoH (kdig does not verify it)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.2",
                    "-keyout", f"{directory}/key.pem", "-out", f"{directory}/cert.pem"],
                   check=True, capture_output=True)
EXAMPLE_ZONE = """$ORIGIN example.test.
$TTL 300
@       SOA ns1 hostmaster 1 3600 900 604800 300
@       NS  ns1
ns1     A   127.0.0.1
www     A   192.0.2.1
www     AAAA 2001:db8::1
mail    MX  10 www
big     TXT "{}"
""".format("a" * 200)


def knot_config(d, sink_socket, sink_file, identity):
    """Knot DNS 3.2 for example.test on 127.0.0.1@53 and ::1@53, dnstap of queries and responses (responses
    with their queries) to our socket and to a file at once (two mod-dnstap instances; sink_file None: the
    socket only)."""
    taps = []
    sinks = [(tap_id, sink) for tap_id, sink in (("sock", f"unix:{sink_socket}"), ("file", sink_file)) if sink]
    for tap_id, sink in sinks:
        taps.append(f"""  - id: {tap_id}
    sink: "{sink}"
    identity: "{identity}"
    log-queries: on
    log-responses: on
    responses-with-queries: on""")
    return f"""server:
    rundir: "{d}/knot"
    listen: [ 127.0.0.1@53, ::1@53 ]
database:
    storage: "{d}/knot/db"
log:
  - target: stderr
    any: info
mod-dnstap:
{chr(10).join(taps)}
template:
  - id: default
    storage: "{d}/knot"
    global-module: [ {", ".join(f"mod-dnstap/{tap_id}" for tap_id, _ in sinks)} ]
zone:
  - domain: example.test
    file: "example.test.zone"
"""


def kresd_config(d, sink_socket, identity, names):
    """Knot Resolver 5.6 on 127.0.0.2: DNS on 53, DoT on 853, DoH (doh2) on 443; answers `names` from hints and
    refuses everything else (no module that would reach the internet); dnstap of its clients' messages."""
    hints = "\n".join(f"hints.set('{n} 192.0.2.{i % 200 + 7}')" for i, n in enumerate(names))
    return f"""net.listen('127.0.0.2', 53, {{ kind = 'dns' }})
net.listen('127.0.0.2', 853, {{ kind = 'tls' }})
net.listen('127.0.0.2', 443, {{ kind = 'doh2' }})
net.tls('{d}/cert.pem', '{d}/key.pem')
cache.size = 10 * MB
trust_anchors.remove('.')
for _, m in ipairs({{ 'priming', 'detect_time_skew', 'ta_signal_query', 'ta_update' }}) do
  pcall(modules.unload, m)
end
modules = {{
  'hints > iterate',
  dnstap = {{
    socket_path = '{sink_socket}',
    identity = '{identity}',
    client = {{ log_queries = true, log_responses = true }},
  }},
}}
{hints}
policy.add(policy.suffix(policy.PASS, {{ todname('local.test.') }}))
policy.add(policy.all(policy.DENY_MSG('no internet here')))
"""


def unbound_config(d, sink_socket, identity, names):
    """Unbound 1.17 on 127.0.0.3: DNS on 53, DoT on 853; local data only (never recursion), dnstap of its
    clients' messages."""
    data = "\n".join(f'    local-data: "{n}. A 192.0.2.{i % 200 + 9}"' for i, n in enumerate(names))
    return f"""server:
    username: ""
    chroot: ""
    directory: "{d}/unbound"
    pidfile: ""
    use-syslog: no
    logfile: ""
    verbosity: 1
    num-threads: 2
    interface: 127.0.0.3@53
    interface: 127.0.0.3@853
    tls-port: 853
    tls-service-key: "{d}/key.pem"
    tls-service-pem: "{d}/cert.pem"
    access-control: 127.0.0.0/8 allow
    module-config: "iterator"
    local-zone: "." refuse
    local-zone: "local.test." static
{data}
remote-control:
    control-enable: no
dnstap:
    dnstap-enable: yes
    dnstap-bidirectional: yes
    dnstap-socket-path: "{sink_socket}"
    dnstap-send-identity: yes
    dnstap-identity: "{identity}"
    dnstap-send-version: yes
    dnstap-log-client-query-messages: yes
    dnstap-log-client-response-messages: yes
"""
