#!/usr/bin/python3
"""rdma-core's own test suite (the pyverbs tests Debian ships in python3-pyverbs, rdma-core 44)
against ferroce's libibverbs.so.1, on a veth device in a network namespace.

Every module that is not specific to mlx5 or EFA runs in its own process under a time limit,
with the drop-in first on LD_LIBRARY_PATH and FERROCE_DEVICES naming the veth end. The table
module -> ran / passed / skipped / failed / errors is printed (and written as JSON with
--json FILE). The run fails on any failure, error or timeout, and on any skip whose reason is
not one docs/ibverbs.md gives ("Skipped, and why"): each allowed reason is listed below with
the feature it names.

  scripts/rdma-core-tests.py                  build the drop-in, run every module
  scripts/rdma-core-tests.py test_cq test_mr  only these modules
  scripts/rdma-core-tests.py --lib DIR        use the libibverbs.so.1 in DIR (no build)

Root only (network namespaces, AF_PACKET, huge pages). Needs python3-pyverbs and rdma-core's
tests under /usr/share/doc/rdma-core/tests (both from python3-pyverbs).
"""

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SRC = "/usr/share/doc/rdma-core/tests"
NS = "frpyv"
IFACE = "frpyv0"
PEER = "frpyv1"
ADDR = "192.168.79.1/24"
# Huge pages the parent-domain and ODP tests allocate (2 MiB each).
HUGE_PAGES = 64
# Seconds one module may take; the slowest (test_qpex, test_odp) take under a minute.
MODULE_LIMIT = 300

# Skips docs/ibverbs.md explains, by the reason rdma-core's tests give: (pattern, feature).
ALLOWED_SKIPS = [
    (r"^Device memory is not supported$", "device memory (memory on the NIC)"),
    (r"cuda-python|CUDA", "CUDA"),
    (r"^Allocating dmabuf is not supported", "dma-buf (another device's memory)"),
    (r"^Multicast is not supported on this device$", "multicast (rdma_join_multicast)"),
    (r"^Create XRCD is not supported$", "XRC"),
    (r"^Can not run the test over non (MLX5|EFA) device$", "vendor-specific test"),
    (r"^Create player with xrc_send", "XRC"),
    (r"^ODP implicit is not supported$", "implicit on-demand paging (the whole address space)"),
]


def unpack(dst):
    """rdma-core's tests, gunzipped, in dst/tests."""
    tests = os.path.join(dst, "tests")
    os.makedirs(tests, exist_ok=True)
    for name in os.listdir(SRC):
        src = os.path.join(SRC, name)
        if name.endswith(".gz"):
            with gzip.open(src, "rb") as f, open(os.path.join(tests, name[:-3]), "wb") as o:
                o.write(f.read())
        else:
            shutil.copy(src, os.path.join(tests, name))
    return tests


def modules(tests, only):
    names = sorted(
        f[:-3]
        for f in os.listdir(tests)
        if f.startswith("test_") and f.endswith(".py") and "mlx5" not in f and "efa" not in f
    )
    return [n for n in names if not only or n in only]


def sysfs_net(dev, iface):
    """/sys/class/infiniband/DEV/device/net/IFACE, as a kernel RDMA device's sysfs has it:
    rdma-core's rdma_cm tests find the device's address through it. In the child's own mount
    namespace (unshare -m, private), /sys/class becomes a tmpfs holding every real class
    (bind-mounted back) and that one path; nothing outside the child sees it."""
    real = tempfile.mkdtemp(prefix="ferroce-sysclass-")
    sh("mount", "--bind", "/sys/class", real)
    sh("mount", "-t", "tmpfs", "ferroce-sysclass", "/sys/class")
    for name in os.listdir(real):
        os.mkdir(os.path.join("/sys/class", name))
        sh("mount", "--bind", os.path.join(real, name), os.path.join("/sys/class", name))
    os.makedirs(f"/sys/class/infiniband/{dev}/device/net/{iface}")


def run_module(tests, name):
    """Child mode: run one module, print one JSON line of outcomes."""
    import unittest

    sysfs_net("ferroce0", IFACE)

    sys.path.insert(0, os.path.dirname(tests))
    sys.path.insert(0, tests)
    from args_parser import parser  # noqa: E402  (rdma-core's)

    sys.argv = [sys.argv[0], "--dev", "ferroce0"]
    parser.parse_args()
    import importlib

    mod = importlib.import_module("tests." + name)
    suite = unittest.TestLoader().loadTestsFromModule(mod)
    outcomes = []

    class Result(unittest.TestResult):
        def addSuccess(self, test):
            outcomes.append((test.id(), "passed", ""))

        def addSkip(self, test, reason):
            outcomes.append((test.id(), "skipped", reason))

        def addFailure(self, test, err):
            outcomes.append((test.id(), "failed", self._exc_info_to_string(err, test)))

        def addError(self, test, err):
            outcomes.append((test.id(), "error", self._exc_info_to_string(err, test)))

        def addExpectedFailure(self, test, err):
            outcomes.append((test.id(), "passed", "expected failure"))

        def addUnexpectedSuccess(self, test):
            outcomes.append((test.id(), "failed", "unexpected success"))

    suite.run(Result())
    print("RESULT " + json.dumps(outcomes), flush=True)


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def setup_veth():
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", IFACE, "type", "veth", "peer", "name", PEER)
    sh("ip", "link", "set", IFACE, "netns", NS)
    sh("ip", "link", "set", PEER, "netns", NS)
    for cmd in (
        ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "set", IFACE, "mtu", "9000"],
        ["ip", "link", "set", PEER, "mtu", "9000"],
        ["ip", "addr", "add", ADDR, "dev", IFACE],
        ["ip", "link", "set", IFACE, "up"],
        ["ip", "link", "set", PEER, "up"],
    ):
        sh("ip", "netns", "exec", NS, *cmd)


def allowed(reason):
    for pattern, feature in ALLOWED_SKIPS:
        if re.search(pattern, reason):
            return feature
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*")
    ap.add_argument("--lib", help="directory holding libibverbs.so.1 (default: build it)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--service", metavar="FERROCE",
                    help="run through `FERROCE serve` (that binary) on the veth end: the drop-in as a thin "
                         "client (FERROCE_SERVICE); a measurement, not CI's check")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tests", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return run_module(a.tests, a.child)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = a.lib
    if not lib:
        # FERROCE_PROFILE and FERROCE_BUILD as in the other drop-in scripts: one build.
        profile = os.environ.get("FERROCE_PROFILE", "release")
        build = os.environ.get("FERROCE_BUILD", "-p ferroce-ibverbs -p ferroce-rdmacm -p ferroce-cli")
        subprocess.run(["cargo", "build", "-q", "--profile", profile] + build.split(),
                       cwd=root, check=True)
        lib = os.path.join(root, "target", "pyverbs-lib")
        os.makedirs(lib, exist_ok=True)
        shutil.copy(os.path.join(root, "target", profile, "libibverbs.so"), os.path.join(lib, "libibverbs.so.1"))
        shutil.copy(os.path.join(root, "target", profile, "librdmacm.so"), os.path.join(lib, "librdmacm.so.1"))
    work = tempfile.mkdtemp(prefix="ferroce-pyverbs-")
    tests = unpack(work)
    names = modules(tests, a.modules)
    with open("/proc/sys/vm/nr_hugepages") as f:
        huge_before = int(f.read())
    try:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(str(max(huge_before, HUGE_PAGES)))
    except OSError as e:
        print(f"cannot reserve huge pages: {e}", file=sys.stderr)
    setup_veth()
    env = dict(os.environ, LD_LIBRARY_PATH=lib, FERROCE_DEVICES=f"afpacket:{IFACE}",
               FERROCE_STATS_DIR=os.path.join(work, "stats"))
    service = None
    if a.service:
        sock = os.path.join(work, "service.sock")
        service = subprocess.Popen(["ip", "netns", "exec", NS, a.service, "serve", "--device",
                                    f"afpacket:{IFACE}", "--socket", sock, "--mode", "0600"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        del env["FERROCE_DEVICES"]
        env["FERROCE_SERVICE"] = sock
    rows, bad = [], []
    try:
        for name in names:
            start = time.monotonic()
            cmd = ["ip", "netns", "exec", NS, "unshare", "--mount", "--propagation", "private",
                   "/usr/bin/python3", os.path.abspath(__file__),
                   "--child", name, "--tests", tests]
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MODULE_LIMIT)
                out = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                outcomes = json.loads(out[-1][7:]) if out else None
                crash = None if outcomes is not None else f"exit {p.returncode}: {p.stderr[-2000:]}"
            except subprocess.TimeoutExpired:
                outcomes, crash = None, f"hung: killed after {MODULE_LIMIT} s"
            secs = time.monotonic() - start
            if outcomes is None:
                rows.append({"module": name, "ran": 0, "passed": 0, "skipped": 0, "failed": 0,
                             "errors": 1, "seconds": round(secs, 1), "skips": {}})
                bad.append(f"{name}: {crash}")
                continue
            row = {"module": name, "ran": len(outcomes), "passed": 0, "skipped": 0, "failed": 0,
                   "errors": 0, "seconds": round(secs, 1), "skips": {}}
            for test, outcome, detail in outcomes:
                if outcome == "passed":
                    row["passed"] += 1
                elif outcome == "skipped":
                    row["skipped"] += 1
                    feature = allowed(detail)
                    key = f"{detail} [{feature}]" if feature else detail
                    row["skips"][key] = row["skips"].get(key, 0) + 1
                    if not feature:
                        bad.append(f"{test}: skipped for a reason docs/ibverbs.md does not give: {detail}")
                elif outcome == "failed":
                    row["failed"] += 1
                    bad.append(f"{test}: FAILED\n{detail}")
                else:
                    row["errors"] += 1
                    bad.append(f"{test}: ERROR\n{detail}")
            rows.append(row)
            print(f"{name:24} ran {row['ran']:3}  passed {row['passed']:3}  skipped {row['skipped']:3}  "
                  f"failed {row['failed']}  errors {row['errors']}  ({secs:.0f} s)", flush=True)
    finally:
        if service:
            service.terminate()
            service.wait()
        sh("ip", "netns", "del", NS, check=False)
        try:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(huge_before))
        except OSError:
            pass
        shutil.rmtree(work, ignore_errors=True)
    total = {k: sum(r[k] for r in rows) for k in ("ran", "passed", "skipped", "failed", "errors")}
    print(f"{'total':24} ran {total['ran']:3}  passed {total['passed']:3}  skipped {total['skipped']:3}  "
          f"failed {total['failed']}  errors {total['errors']}")
    reasons = {}
    for r in rows:
        for k, n in r["skips"].items():
            reasons[k] = reasons.get(k, 0) + n
    for k, n in sorted(reasons.items(), key=lambda x: -x[1]):
        print(f"  skipped {n:3}: {k}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"modules": rows, "total": total, "problems": bad}, f, indent=1)
    if bad:
        print("\n".join(["", "PROBLEMS:"] + bad), file=sys.stderr)
        return 1
    print("rdma-core's tests: no failure, no error, no hang, every skip explained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
