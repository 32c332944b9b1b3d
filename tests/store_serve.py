#!/usr/bin/env python3
"""Sessions that survive their server (run by tests/t_store_serve.sh; python3 standard library only).

Two servers on the same tiny model: K, started without --store (so with the default store, the file
in its data directory, $ISOBATCH_DATA_DIR here), which is killed (SIGKILL, during sixteen concurrent
session generations) and restarted, then stopped with SIGTERM and restarted; and R, a reference
(--store none) that is never killed and gets the same requests. Checked:
  - every acknowledged token (appends and generations answered 200) is in K's store after the kill
    (read straight from the SQLite file), in order, and nothing but whole generations beyond them;
  - after each restart the sessions are listed from the store, not resident, with the right token
    counts; each one's next generation (token ids, logprobs, and the verification digest when the
    server reports one) equals R's, and the session is resident afterwards;
  - a windowed (sink + window) session whose window has slid comes back alike;
  - a server whose rebuild is broken (--inject rebuild-drop-token) fails that comparison;
  - a server of another model refuses the stored session (409 session_model_mismatch);
  - bad --store values and unusable store files: one-line errors, non-zero exit;
  - the data directory: --data-dir over $ISOBATCH_DATA_DIR over $XDG_DATA_HOME/isobatch over
    $HOME/.local/share/isobatch, created with mode 0700; one that cannot be created (a path under a
    regular file, a name too long) or holds a file that is not a store: a one-line error naming it,
    a non-zero exit, and no directory left behind (nor after a start that fails later);
  - --store none keeps nothing across a restart, and creates no data directory.
Usage: store_serve.py BIN WORKDIR
"""
import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time

import harness
from harness import ok, bad, check, finish, procs

BIN, T = sys.argv[1], sys.argv[2]
harness.NAME = "t_store_serve"
KEY = "store-key"


class Server:
    def __init__(self, name, model, *args, env=None, unset=()):
        """serve model with args, its environment this process's less unset plus env"""
        self.name = name
        self.log = os.path.join(T, name + ".log")
        port_file = os.path.join(T, name + ".port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        self.p = subprocess.Popen([BIN, "serve", "-m", model, "--port", "0", "--port-file", port_file, "--threads", "2",
                                   "--api-key", KEY, "--no-request-log", "--prefill-chunk", "8", *args],
                                  stderr=open(self.log, "ab"),
                                  env={**{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})})
        procs.append(self.p)
        for _ in range(200):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        else:
            pass
        if not os.path.exists(port_file):
            print(open(self.log).read()[-2000:])
            bad(f"{name}: server did not start")
            finish()
        self.url = "http://127.0.0.1:%d" % int(open(port_file).read())

    def req(self, method, path, body=None, timeout=60):
        return harness.http_json(self.url, method, path, body, headers={"Authorization": "Bearer " + KEY},
                                 timeout=timeout)

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def term(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "timeout"
        check(rc == 0, f"{self.name}: SIGTERM exit {rc}")
        log = open(self.log).read()
        check("Sanitizer" not in log and "runtime error" not in log, f"{self.name}: sanitizer report")


def gen_ids(body):
    """every token id drawn by a session generation (its verification record: the stop token too), the
    running digests of the logits rows that chose them, and the logprobs (asked with logprobs: 0)"""
    v = body.get("verification") or {}
    return v.get("tokens", []), (v.get("step_digests"), body["choices"][0]["logprobs"]["token_logprobs"])


def digest_of(body):
    v = body.get("verification")
    return v.get("digest") if isinstance(v, dict) else None


def stored_history(db, sid):
    """the token ids of session sid in the SQLite store file db (oldest first), or None"""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT first, tokens FROM history WHERE session_id = ? ORDER BY first", (sid,)).fetchall()
    finally:
        con.close()
    out = []
    for first, blob in rows:
        if first != len(out):
            return None
        out += list(struct.unpack("<%di" % (len(blob) // 4), blob))
    return out


model = os.path.join(T, "tiny")
other = os.path.join(T, "tiny10")
subprocess.run([BIN, "mkmodel", "--preset", "tiny", "--seed", "9", "--out", model], check=True, stdout=subprocess.DEVNULL)
subprocess.run([BIN, "mkmodel", "--preset", "tiny", "--seed", "10", "--out", other], check=True, stdout=subprocess.DEVNULL)
data = os.path.join(T, "data")
db = os.path.join(data, "sessions.db")
DATA_ENV = {"ISOBATCH_DATA_DIR": data}  # K's data directory, named by the environment alone

# ---- bad store arguments: one line, non-zero exit
for args, what in ((["--store", "bogus:x"], "unknown kind"), (["--store", "sqlite:" + T + "/no/such/dir/s.db"], "no dir"),
                   (["--store", "sqlite:" + model + "/config.json"], "not a database")):
    r = subprocess.run([BIN, "serve", "-m", model, "--port", "0", *args], capture_output=True, text=True, timeout=30)
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("isobatch serve: model")]
    check(r.returncode != 0 and len(lines) == 1 and "store" in lines[0].lower() + " ".join(args),
          f"--store {what}: exit {r.returncode}, stderr {r.stderr.strip()[:300]!r}")


def fails_with_one_line(args, what, env=None, rc=None):
    """serve ARGS (with env added to the environment) exits non-zero (rc when given) within 30 s,
    printing one line; returns that line ("" when the check failed)"""
    try:
        r = subprocess.run([BIN, "serve", "-m", model, "--port", "0", *args], capture_output=True, text=True,
                           timeout=30, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        bad(f"{what}: no exit within 30 s")
        return ""
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("isobatch serve: model")]
    good = r.returncode != 0 and (rc is None or r.returncode == rc) and len(lines) == 1
    check(good, f"{what}: exit {r.returncode}, stderr {r.stderr.strip()[:400]!r}")
    return lines[0] if good else ""


# ---- the data directory: which one, created how, and the ones that cannot be used
def precedence(label, args, env, expect, others):
    """a server started with args and, of ISOBATCH_DATA_DIR, XDG_DATA_HOME and HOME, only those in env
    makes its default store in expect (a directory of mode 0700), and nothing in the others"""
    s = Server("dd_" + label, model, *args, env=env, unset=("ISOBATCH_DATA_DIR", "XDG_DATA_HOME", "HOME"))
    s.term()
    f = os.path.join(expect, "sessions.db")
    check(os.path.isfile(f) and os.stat(expect).st_mode & 0o777 == 0o700,
          f"data directory, {label}: no store in {expect} (mode 0700): {os.listdir(os.path.dirname(expect)) if os.path.isdir(os.path.dirname(expect)) else 'missing'}")
    stray = [o for o in others if os.path.exists(o)]
    check(not stray, f"data directory, {label}: also created {stray}")


P = os.path.join(T, "prec")
flag_d, env_d, xdg_d, home_d = (os.path.join(P, n) for n in ("flag", "env", "xdg", "home"))
xdg_store, home_store = os.path.join(xdg_d, "isobatch"), os.path.join(home_d, ".local", "share", "isobatch")
precedence("flag", ["--data-dir", flag_d], {"ISOBATCH_DATA_DIR": env_d, "XDG_DATA_HOME": xdg_d, "HOME": home_d},
           flag_d, [env_d, xdg_store, home_store])
precedence("env", [], {"ISOBATCH_DATA_DIR": env_d, "XDG_DATA_HOME": xdg_d, "HOME": home_d},
           env_d, [xdg_store, home_store])
precedence("xdg", [], {"XDG_DATA_HOME": xdg_d, "HOME": home_d}, xdg_store, [home_store])
precedence("home", [], {"XDG_DATA_HOME": "relative-xdg-is-ignored", "HOME": home_d}, home_store,
           ["relative-xdg-is-ignored"])

afile = os.path.join(T, "afile")
open(afile, "w").write("not a directory\n")
line = fails_with_one_line(["--data-dir", os.path.join(afile, "sub")], "--data-dir under a regular file")
check(afile in line and "not a directory" in line, f"--data-dir under a regular file: the line names neither: {line!r}")
line = fails_with_one_line([], "$ISOBATCH_DATA_DIR under a regular file", {"ISOBATCH_DATA_DIR": os.path.join(afile, "sub", "x")})
check(afile in line, f"$ISOBATCH_DATA_DIR under a regular file: the line does not name it: {line!r}")
fresh = os.path.join(T, "fresh")
line = fails_with_one_line(["--data-dir", os.path.join(fresh, "x" * 300, "y")], "a data directory name too long")
check(not os.path.exists(fresh), "a data directory that could not be created left its parent behind")
# a start that fails after the data directory was made (a model directory without config.json)
no_model = os.path.join(T, "no_model")
os.mkdir(no_model)
r = subprocess.run([BIN, "serve", "-m", no_model, "--port", "0", "--data-dir", os.path.join(fresh, "a")],
                   capture_output=True, text=True, timeout=30)
check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(fresh),
      f"a failed start left its new data directory behind: exit {r.returncode}, {r.stderr.strip()[:300]!r}")
fails_with_one_line([], "an empty $ISOBATCH_DATA_DIR", {"ISOBATCH_DATA_DIR": ""}, rc=2)
junk_d = os.path.join(T, "junk")
os.mkdir(junk_d)
junk = os.path.join(junk_d, "sessions.db")
open(junk, "wb").write(b"this is not an SQLite database, and must stay as it is\n" * 20)
before = open(junk, "rb").read()
line = fails_with_one_line(["--data-dir", junk_d], "a data directory whose sessions.db is not a store")
check(junk in line, f"a sessions.db that is not a store: the line does not name it: {line!r}")
check(open(junk, "rb").read() == before and sorted(os.listdir(junk_d)) == ["sessions.db"],
      f"a sessions.db that is not a store was changed: {os.listdir(junk_d)}")

# ---- --store none: nothing kept across a restart, no data directory made
none_d = os.path.join(T, "none_data")
N = Server("N", model, "--store", "none", env={"ISOBATCH_DATA_DIR": none_d})
st, body = N.req("POST", "/v1/sessions", {})
nid = body["id"] if st == 200 else "sess_none"
st2, _ = N.req("POST", f"/v1/sessions/{nid}/append", {"tokens": [5, 6, 7]})
st3, _ = N.req("POST", f"/v1/sessions/{nid}/generate", {"max_tokens": 3})
check(st == st2 == st3 == 200, f"--store none: session calls {st} {st2} {st3}")
N.kill9()
N = Server("N2", model, "--store", "none", env={"ISOBATCH_DATA_DIR": none_d})
st, body = N.req("GET", f"/v1/sessions/{nid}")
check(st == 404, f"--store none: the session came back after a restart: {st} {body}")
st, body = N.req("GET", "/v1/sessions")
check(st == 200 and body.get("data") == [], f"--store none: sessions listed after a restart: {st} {body}")
N.term()
check(not os.path.exists(none_d), "--store none created the data directory")

K = Server("K", model, "--token-delay-ms", "4", env=DATA_ENV)
R = Server("R", model, "--store", "none")

# sessions: several policies; each has a reference twin on R
# sixteen sessions, generating at once when the server is killed
POLICIES = ([None, None, "sink:4,window:24", None, "window:40", None] * 3)[:16]
sess = []  # [k_id, r_id]
for pol in POLICIES:
    body = {} if pol is None else {"kv": pol}
    a, b = K.req("POST", "/v1/sessions", body), R.req("POST", "/v1/sessions", body)
    if not check(a[0] == 200 and b[0] == 200, f"create: {a} {b}"):
        finish()
    sess.append([a[1]["id"], b[1]["id"]])
if not check(os.path.isfile(db), f"no store at {db}: a server without --store kept its sessions nowhere"):
    finish()
acked = {k: [] for k, _ in sess}  # tokens K acknowledged, per K session


def both(i, method, action, body):
    """the same request on K and R for session pair i; returns (K answer, R answer)"""
    k, r = sess[i]
    return K.req(method, f"/v1/sessions/{k}/{action}", body), R.req(method, f"/v1/sessions/{r}/{action}", body)


def params(i, rnd, n):
    return {"max_tokens": n, "seed": 1000 * rnd + i, "temperature": 0.9, "top_k": 40, "repetition_penalty": 1.3,
            "logprobs": 0}


# ---- phase 1: appends and generations, both servers, compared as they go
for rnd in range(3):
    for i in range(len(sess)):
        toks = [(7 * i + 13 * rnd + j * 5) % 250 + 1 for j in range(9 + 3 * i)]
        a, b = both(i, "POST", "append", {"tokens": toks})
        if check(a[0] == 200 and b[0] == 200, f"append {i}: {a} {b}"):
            acked[sess[i][0]] += toks
        a, b = both(i, "POST", "generate", params(i, rnd, 6 + 2 * i))
        if check(a[0] == 200 and b[0] == 200, f"generate {i}: {a} {b}"):
            ta, la = gen_ids(a[1])
            tb, lb = gen_ids(b[1])
            check(ta == tb and la == lb, f"round {rnd} session {i}: K and R differ before any restart")
            acked[sess[i][0]] += ta

# ---- phase 2: concurrent generations on K, some short (answered), some long; SIGKILL meanwhile
results = {}


def run_gen(i, n):
    k = sess[i][0]
    try:
        results[i] = K.req("POST", f"/v1/sessions/{k}/generate", params(i, 7, n), timeout=30)
    except Exception as e:  # the connection dies with the server
        results[i] = (None, str(e))


long_n = {i: (3 if i % 2 == 0 else 150) for i in range(len(sess))}
th = [threading.Thread(target=run_gen, args=(i, long_n[i])) for i in range(len(sess))]
for t in th:
    t.start()
time.sleep(1.0)
K.kill9()
for t in th:
    t.join()
n_answered = sum(1 for r in results.values() if r[0] == 200)
check(n_answered >= 1 and n_answered < len(sess), f"the kill came during the generations: {n_answered} answered")
for i, r in results.items():
    if r[0] == 200:
        acked[sess[i][0]] += gen_ids(r[1])[0]

# every acknowledged token is in the store, in order; beyond them at most one whole generation
committed_extra = {}
for i, (k, _) in enumerate(sess):
    h = stored_history(db, k)
    a = acked[k]
    if os.environ.get("STORE_DEBUG"):
        print(i, results[i][0], len(a), h and len(h), results[i][1] if results[i][0] == 200 else "", file=sys.stderr)
    if check(h is not None and h[:len(a)] == a, f"session {i}: acknowledged tokens missing from the store after kill -9"):
        committed_extra[i] = len(h) - len(a)
        check(results[i][0] != 200 or len(h) == len(a),
              f"session {i}: {len(h) - len(a)} tokens stored beyond its answered generation")
integrity = sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0]
check(integrity == "ok", f"integrity after kill -9: {integrity}")

# the reference does what K made durable (the answered generations, and any whose commit made it)
for i in range(len(sess)):
    if results[i][0] == 200 or committed_extra.get(i, 0) > 0:
        b = R.req("POST", f"/v1/sessions/{sess[i][1]}/generate", params(i, 7, long_n[i]))
        tb = gen_ids(b[1])[0] if b[0] == 200 else None
        if results[i][0] == 200:
            check(tb == gen_ids(results[i][1])[0], f"session {i}: the generation answered before the kill differs from R's")
        else:
            h = stored_history(db, sess[i][0])
            check(tb is not None and h[len(acked[sess[i][0]]):] == tb, f"session {i}: the committed, unanswered generation differs from R's")
        if tb and results[i][0] != 200:
            acked[sess[i][0]] += tb


def compare_next(rnd, label, expect_match=True):
    """one generation on every session of K (just restarted) and R: equal ids, logprobs, digest"""
    st, lst = K.req("GET", "/v1/sessions")
    listed = {d["id"]: d["resident"] for d in lst.get("data", [])} if st == 200 else {}
    check(all(k in listed and listed[k] is False for k, _ in sess), f"{label}: sessions listed from the store, not resident: {lst}")
    diffs = 0
    for i, (k, r) in enumerate(sess):
        si = K.req("GET", f"/v1/sessions/{k}")
        ri = R.req("GET", f"/v1/sessions/{r}")
        check(si[0] == 200 and si[1]["resident"] is False and si[1]["tokens_held"] == ri[1]["tokens_held"] ==
              len(acked[k]), f"{label}: session {i} info {si} vs R {ri[1]['tokens_held']} / {len(acked[k])}")
        a, b = both(i, "POST", "generate", params(i, rnd, 10))
        if not check(a[0] == 200 and b[0] == 200, f"{label}: generate {i}: {a} {b}"):
            continue
        same = gen_ids(a[1]) == gen_ids(b[1]) and digest_of(a[1]) == digest_of(b[1])
        if expect_match:
            check(same, f"{label}: session {i}: the continuation after the restart differs from the uninterrupted server's")
        diffs += not same
        acked[k] += gen_ids(b[1])[0]
        if not expect_match:
            continue
        si = K.req("GET", f"/v1/sessions/{k}")
        check(si[0] == 200 and si[1]["resident"] is True and si[1]["tokens_held"] == len(acked[k]),
              f"{label}: session {i} after its generation: {si}")
    return diffs


# ---- phase 3: restart after the kill
K = Server("K2", model, env=DATA_ENV)
compare_next(8, "after kill -9")
# and appends after a rebuild are stored too
for i in range(len(sess)):
    a, b = both(i, "POST", "append", {"tokens": [32, 97, 110, 100]})
    if check(a[0] == 200 and b[0] == 200, f"append after rebuild {i}"):
        acked[sess[i][0]] += [32, 97, 110, 100]

# a session of the client's id (POST /v1/sessions/{id}) is stored like the others
st, body = K.req("POST", "/v1/sessions/chosen-1.x", {"max_context": 64})
check(st == 200 and body.get("id") == "chosen-1.x", f"a session of a chosen id: {st} {body}")
st, body = K.req("POST", "/v1/sessions/chosen-1.x/append", {"tokens": [72, 101, 108]})
check(st == 200, f"append to the chosen id: {st} {body}")

# ---- phase 4: SIGTERM, restart
K.term()
# --data-dir names the same directory; the environment names another, which the flag overrides
elsewhere = os.path.join(T, "elsewhere")
K = Server("K3", model, "--data-dir", data, env={"ISOBATCH_DATA_DIR": elsewhere})
compare_next(9, "after SIGTERM")
# the chosen id is in the store, not in memory: creating it again is refused by the store (409), and it
# loads with its tokens
st, body = K.req("POST", "/v1/sessions/chosen-1.x", {})
check(st == 409 and body and body["error"]["code"] == "session_exists", f"a stored chosen id created again: {st} {body}")
st, body = K.req("GET", "/v1/sessions/chosen-1.x")
check(st == 200 and body.get("tokens_held") == 3 and body.get("max_context") == 64, f"the stored chosen id: {st} {body}")
check(not os.path.exists(elsewhere), "--data-dir given, yet $ISOBATCH_DATA_DIR's directory was created")

# ---- phase 5: another model's server refuses the stored sessions
K.term()
O = Server("O", other, env=DATA_ENV)  # the same default file, another model
st, body = O.req("GET", f"/v1/sessions/{sess[0][0]}")
check(st == 409 and body and body["error"]["code"] == "session_model_mismatch" and "sha256:" in body["error"]["message"],
      f"another model: {st} {body}")
st, body = O.req("POST", f"/v1/sessions/{sess[0][0]}/generate", {"max_tokens": 2})
check(st == 409, f"another model, generate: {st} {body}")
st, body = O.req("GET", "/v1/sessions/sess_nosuchsession")
check(st == 404, f"unknown id: {st}")
O.term()

# ---- phase 6: a broken rebuild must be caught by the same comparison
K = Server("K4", model, "--inject", "rebuild-drop-token", env=DATA_ENV)
d = compare_next(10, "rebuild-drop-token", expect_match=False)
check(d > 0, "the rebuild-drop-token fault went unnoticed: the comparison cannot fail")
K.term()
R.term()
finish()
