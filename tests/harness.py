"""harness.py — what the Python test drivers (tests/*.py behind tests/t_*.sh) share: counting checks
and printing the suite's "NAME: N passed, N failed" line, the server processes to kill at the end, and
JSON over HTTP.

    import harness
    from harness import ok, bad, check, finish, procs
    harness.NAME = "t_something"       # the summary line's name
    harness.BEFORE_END.append(fn)      # run by finish() before the summary (more checks, cleanup)

A server started without --store keeps its sessions in the data directory ($ISOBATCH_DATA_DIR, else
under $HOME). The t_*.sh scripts export a directory of their own; when a driver runs without one,
importing this module points ISOBATCH_DATA_DIR at a new temporary directory, removed when the driver
exits, so a test never writes into the real home directory.
"""
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

NAME = "test"
BEFORE_END = []
procs = []  # subprocesses finish() kills if they still run
_counts = {"passed": 0, "failed": 0}
_lock = threading.Lock()  # checks may come from several threads

if "ISOBATCH_DATA_DIR" not in os.environ:
    _data_dir = tempfile.mkdtemp(prefix="ib_data_")
    os.environ["ISOBATCH_DATA_DIR"] = _data_dir
    atexit.register(shutil.rmtree, _data_dir, True)


def ok():
    with _lock:
        _counts["passed"] += 1


def bad(msg):
    with _lock:
        _counts["failed"] += 1
    print("FAIL:", msg, flush=True)


def check(cond, msg):
    """count cond as a pass, or a failure printing msg; returns cond"""
    ok() if cond else bad(msg)
    return cond


def finish():
    """kill what still runs, print the summary line and exit (0 when nothing failed)"""
    for fn in BEFORE_END:
        fn()
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    print(f"{NAME}: {_counts['passed']} passed, {_counts['failed']} failed")
    sys.exit(0 if _counts["failed"] == 0 else 1)


def http_json(url, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON body or None) of one request; status 0 and the reason when no answer came"""
    data = json.dumps(body).encode() if body is not None else None
    h = {"Content-Type": "application/json", **(headers or {})}
    r = urllib.request.Request(url + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return f.status, json.loads(f.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except Exception:
            return e.code, None
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return 0, str(e)


def verify_cli(bin_path, model, rec, path, timeout=300):
    """`BIN verify -m MODEL --json PATH` on record rec (written to path): (exit status, the JSON verdict
    or None, stderr)"""
    with open(path, "w") as fh:
        json.dump(rec, fh)
    r = subprocess.run([bin_path, "verify", "-m", model, "--json", path], capture_output=True, text=True,
                       timeout=timeout)
    try:
        res = json.loads(r.stdout) if r.stdout.strip() else None
    except ValueError:
        res = None
    return r.returncode, res, r.stderr
