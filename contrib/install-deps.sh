#!/usr/bin/env bash
# Debian packages that the tests, the demo and the benchmarks use; installs only what is missing.
# Called by `make` (target deps) before the virtualenv is built, so that the DPDK extension finds
# libdpdk at build time. Needs root (apt-get); without root it lists what is missing and goes on.
#
# `install-deps.sh sanitizers`: only what the sanitizer build needs (make asan, make test-asan, the fuzz
# harnesses): clang and its compiler-rt runtimes, which the normal build and tests do not use.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
if [ "${1:-}" = sanitizers ]; then
  have clang || need+=(clang)
  # libclang_rt.asan-x86_64.so: the ASan+UBSan runtime preloaded into Python (clang prints the bare name when
  # it has no such file)
  { have clang && [ -e "$(clang -print-file-name=libclang_rt.asan-x86_64.so)" ]; } || need+=(libclang-rt-dev)
fi
[ "${1:-}" = sanitizers ] || {  # the tests', the demo's and the benchmarks' packages
have tshark || need+=(tshark)                 # independent DNS oracle in the tests
have xz || need+=(xz-utils)
have tcpreplay || need+=(tcpreplay)           # live-capture tests and demo replay through a veth
have ip || need+=(iproute2)                   # network namespaces and veth pairs
have dnscap || need+=(dnscap)                 # dnsprobe bench compares against these
{ have netsniff-ng && have trafgen; } || need+=(netsniff-ng)  # also trafgen: dnsprobe bench's fast generator
have tcpdump || need+=(tcpdump)
have tmux || need+=(tmux)                     # dnsprobe top's screen test (tests/run/test_top.py)
have perf || need+=(linux-perf)                # benchmarks/profile.py --perf and --live
have java || need+=(openjdk-17-jre-headless)  # Apache Spark reads our Parquet in tests/oracle/test_engines.py
# dnstap: real servers as producers, started by the tests in a network namespace of their own
# (tests/oracle/test_dnstap_servers.py), libfstrm's tools, an independent decoder (golang-dnstap)
servers=()
have knotd || servers+=(knot)
dpkg -s knot-module-dnstap >/dev/null 2>&1 || servers+=(knot-module-dnstap)  # Knot's mod-dnstap: a package of its own
have kresd || servers+=(knot-resolver)
have unbound || servers+=(unbound)
need+=(${servers[@]+"${servers[@]}"})
have kdig || need+=(knot-dnsutils)
have dnsperf || need+=(dnsperf)
have fstrm_replay || need+=(fstrm-bin)
have dnstap || need+=(golang-github-dnstap-golang-dnstap-cli)
have openssl || need+=(openssl)
have chromium || need+=(chromium)             # renders dnsprobe report's page headless (tests/cli/test_report.py)
# The C extensions (export/parquet/_columns.c, probe/decode/_fastwire.c; without them the package falls back to
# slower Python and tests/decode/test_fastwire.py fails) need a C compiler and Python's headers; the DPDK one
# (tests/run/test_dpdk.py) also libdpdk, found with pkg-config.
pkg-config --exists libdpdk 2>/dev/null || need+=(libdpdk-dev pkg-config)
{ have cc && have gcc; } || need+=(gcc)
[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
}
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "not root: cannot install ${need[*]}; the tests that need them will be skipped or fail" >&2
  exit 0
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
mkdir -p /usr/share/man/man1  # slim images lack it, and the OpenJDK package's post-install needs it
# The servers' packages start their services at installation (on port 53; Knot Resolver and Unbound would
# recurse to the internet) and enable them at boot: the tests start servers of their own. A policy-rc.d that
# says no keeps them from starting now (where the image has none of its own), and they are disabled after.
policy=/usr/sbin/policy-rc.d
if [ ${#servers[@]} -gt 0 ] && [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq "${need[@]}" >/dev/null
if [ ${#servers[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
  for unit in knot.service unbound.service unbound-resolvconf.service kresd.target kresd@1.service \
      kres-cache-gc.service $(systemctl list-units --plain --no-legend 'kresd@*' 2>/dev/null | cut -d' ' -f1); do
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  done
fi
