#!/usr/bin/env python3
"""Two replicas behind a real load balancer sharing a PostgreSQL session store (run by tests/t_scaleout.sh;
python3 standard library only).

Replicas A and B (`isobatch serve --store postgresql://...`) behind HAProxy, which routes a session's
requests by its id (`balance uri depth 3`: the path /v1/sessions/ID, consistent hashing) and checks each
replica's /healthz; R, a reference server with no store, never killed, gets the same requests. Checked:
  - conversations (append, then a seeded sampled generation) through the balancer equal R's, tokens and
    logits digests, and each session is held by one replica;
  - the replica holding sessions is killed (SIGKILL) mid-conversation: every conversation continues
    through the balancer on the other replica, which loads the session from the store and rebuilds it,
    with tokens and digests equal to R's;
  - the killed replica restarts: the sessions hashed to it come back to it (loaded from the store) and
    continue equal to R's;
  - that replica killed again: the survivor's copies of those sessions are stale; a stale append is
    refused (409 session_changed, the copy dropped), and the retried conversation still equals R's;
  - a replica whose rebuild is broken (--inject rebuild-drop-token) fails the comparison after a kill.
Usage: scaleout.py BIN WORKDIR PG_URI
"""
import os
import signal
import socket
import subprocess
import sys
import time

import harness
from harness import bad, check, finish, procs

BIN, T, PG_URI = sys.argv[1], sys.argv[2], sys.argv[3]
harness.NAME = "t_scaleout"


def no_sanitizer_reports():
    for name in os.listdir(T):
        if name.endswith(".log") and name != "haproxy.log":
            log = open(os.path.join(T, name), errors="replace").read()
            check("Sanitizer" not in log and "runtime error" not in log, f"{name}: sanitizer report")


harness.BEFORE_END.append(no_sanitizer_reports)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def request(url, method, path, body=None, timeout=60):
    return harness.http_json(url, method, path, body, timeout=timeout)


class Server:
    """an `isobatch serve` process on a fixed port (so a restart keeps the balancer's address)"""

    def __init__(self, name, model, port, *args):
        self.name, self.model, self.port, self.args = name, model, port, args
        self.url = "http://127.0.0.1:%d" % port
        self.start()

    def start(self):
        self.p = subprocess.Popen([BIN, "serve", "-m", self.model, "--port", str(self.port), "--threads", "2",
                                   "--no-request-log", "--prefill-chunk", "8", *self.args],
                                  stderr=open(os.path.join(T, self.name + ".log"), "ab"))
        procs.append(self.p)
        for _ in range(300):
            if request(self.url, "GET", "/healthz", timeout=2)[0] == 200:
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        print(open(os.path.join(T, self.name + ".log"), errors="replace").read()[-2000:])
        bad(f"{self.name}: server did not start")
        finish()

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def holds(self, sid, n_tokens):
        """True when this replica has session sid in memory, resident (its KV built), with all its
        n_tokens tokens (a replica may also keep an older copy: the one that created a session keeps it,
        empty, until it expires; a stale copy is refused by the store at its next write)"""
        st, b = request(self.url, "GET", "/v1/sessions/" + sid, timeout=10)
        return st == 200 and b.get("resident") is True and b.get("tokens_held") == n_tokens


model = os.path.join(T, "tiny")
subprocess.run([BIN, "mkmodel", "--preset", "tiny", "--seed", "9", "--out", model], check=True,
               stdout=subprocess.DEVNULL)
pa, pb, plb = free_port(), free_port(), free_port()
A = Server("A", model, pa, "--store", PG_URI)
B = Server("B", model, pb, "--store", PG_URI)
R = Server("R", model, free_port(), "--store", "none")
reps = {"a": A, "b": B}

cfg = os.path.join(T, "haproxy.cfg")
with open(cfg, "w") as f:
    f.write(f"""global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 3
    option redispatch
    retry-on conn-failure empty-response
frontend isobatch_front
    bind 127.0.0.1:{plb}
    default_backend isobatch_replicas
backend isobatch_replicas
    # a session's requests go to one replica: the hash of /v1/sessions/ID, consistent, so a replica
    # leaving or coming back moves only its own sessions
    balance uri depth 3
    hash-type consistent
    option httpchk GET /healthz
    server a 127.0.0.1:{pa} check inter 200ms fall 2 rise 2
    server b 127.0.0.1:{pb} check inter 200ms fall 2 rise 2
""")
check(subprocess.run(["haproxy", "-c", "-f", cfg], capture_output=True).returncode == 0, "haproxy rejects the config")
hp = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=open(os.path.join(T, "haproxy.log"), "ab"),
                      stderr=subprocess.STDOUT)
procs.append(hp)
LB = "http://127.0.0.1:%d" % plb
for _ in range(100):
    if request(LB, "GET", "/healthz", timeout=2)[0] == 200:
        break
    time.sleep(0.1)
else:
    bad("the balancer never answered")
    finish()
time.sleep(1.0)  # both replicas seen up by the health checks


def wait_down(port):
    """until the balancer's health check has seen a dead replica (no more than fall x inter, and some)"""
    time.sleep(0.8)


N = 8
sess = []  # (id through the balancer, id on R)
for i in range(N):
    a, r = request(LB, "POST", "/v1/sessions", {}), request(R.url, "POST", "/v1/sessions", {})
    if not check(a[0] == 200 and r[0] == 200, f"create {i}: {a} {r}"):
        finish()
    sess.append((a[1]["id"], r[1]["id"]))


# sessions of the client's id (POST /v1/sessions/{id}): the balancer hashes the creation's path as it
# hashes the session's later requests, so the replica that made each one serves it: through the
# balancer every one is resident (a request that reached the other replica would load it from the
# store, not resident)
chosen = [f"chosen-{k}" for k in range(6)]
made = [request(LB, "POST", "/v1/sessions/" + c, {})[0] for c in chosen]
resident = [request(LB, "GET", "/v1/sessions/" + c)[1].get("resident") for c in chosen]
check(made == [200] * 6 and resident == [True] * 6,
      f"sessions of chosen ids, made and served by one replica through the balancer: {made} {resident}")
check(request(LB, "POST", "/v1/sessions/" + chosen[0], {})[0] == 409, "a chosen id taken again through the balancer: not a 409")
for c in chosen:
    request(LB, "DELETE", "/v1/sessions/" + c)


def params(i, rnd):
    return {"max_tokens": 5 + i % 3, "seed": 100 * rnd + i, "temperature": 0.9, "top_k": 40,
            "repetition_penalty": 1.2}


def gen_record(body):
    v = body.get("verification") or {}
    return v.get("tokens"), v.get("step_digests"), body["choices"][0]["text"]


retries = {"409": 0, "other": 0}


def through_lb(method, path, body):
    """a request through the balancer, retried (bounded) on 409 session_changed and on a replica lost
    mid-request (502/503/0), as a client of a replicated service does"""
    for attempt in range(20):
        st, b = request(LB, method, path, body)
        if st == 409 and isinstance(b, dict) and b.get("error", {}).get("code") == "session_changed":
            retries["409"] += 1
            continue
        if st in (0, 502, 503):
            retries["other"] += 1
            time.sleep(0.3)
            continue
        return st, b
    return st, b


def round_(rnd, what, only=None):
    """one conversation step for every session (or those in only): append, then generate; compared with R"""
    same = 0
    for i, (sid, rid) in enumerate(sess):
        if only is not None and i not in only:
            continue
        toks = [(11 * i + 7 * rnd + 3 * j) % 250 + 1 for j in range(6 + i % 4)]
        a = through_lb("POST", f"/v1/sessions/{sid}/append", {"tokens": toks})
        r = request(R.url, "POST", f"/v1/sessions/{rid}/append", {"tokens": toks})
        if not check(a[0] == 200 and r[0] == 200, f"{what}: append {i}: {a} {r}"):
            continue
        a = through_lb("POST", f"/v1/sessions/{sid}/generate", params(i, rnd))
        r = request(R.url, "POST", f"/v1/sessions/{rid}/generate", params(i, rnd))
        if not check(a[0] == 200 and r[0] == 200, f"{what}: generate {i}: {a} {r}"):
            continue
        ga, gr = gen_record(a[1]), gen_record(r[1])
        if ga == gr and ga[0]:
            same += 1
        else:
            print(f"  {what}: session {i}: replica {ga[0]} vs reference {gr[0]}", flush=True)
    return same


def holders():
    """{replica name: [session indexes it holds, resident and up to date]}"""
    held = [request(R.url, "GET", "/v1/sessions/" + rid, timeout=10)[1].get("tokens_held") for _, rid in sess]
    return {n: [i for i, (sid, _) in enumerate(sess) if s.holds(sid, held[i])] for n, s in reps.items()}


# ---- 1. conversations through the balancer, each session on one replica
for rnd in range(2):
    same = round_(rnd, f"round {rnd}")
    check(same == N, f"round {rnd}: {same}/{N} conversations equal the reference")
h = holders()
both = [i for i in range(N) if i in h["a"] and i in h["b"]]
check(not both and len(h["a"]) + len(h["b"]) == N, f"each session held, up to date, by exactly one replica: {h}")
victim = "a" if len(h["a"]) >= len(h["b"]) else "b"
other = "b" if victim == "a" else "a"
moved = h[victim]
print(f"  sessions on a: {h['a']}, on b: {h['b']}; killing {victim}", flush=True)

# ---- 2. kill -9 the replica holding the most sessions; the conversations continue on the other
reps[victim].kill9()
same = round_(2, f"after killing {victim}")
check(same == N, f"after SIGKILL of replica {victim}: {same}/{N} conversations equal the reference")
h = holders()
check(all(i in h[other] for i in moved), f"replica {other} took over {moved}: holds {h[other]}")

# ---- 3. the killed replica restarts: its sessions come back to it, loaded from the store
reps[victim].start()
time.sleep(1.0)  # seen up again (rise 2 x 200 ms)
same = round_(3, f"after restarting {victim}")
check(same == N, f"after replica {victim} restarted: {same}/{N} conversations equal the reference")
h = holders()
check(all(i in h[victim] for i in moved), f"the sessions hashed to {victim} came back to it: {h}")

# ---- 4. killed again: the survivor's copies are stale; its stale append is refused, the retry equal
r409 = retries["409"]
reps[victim].kill9()
same = round_(4, f"after killing {victim} again")
check(same == N, f"after the second SIGKILL of {victim}: {same}/{N} conversations equal the reference")
check(retries["409"] > r409 if moved else True,
      f"the survivor's stale copies were refused (409 session_changed) at least once: {retries}")
reps[victim].start()

# ---- 5. a replica with a broken rebuild: the comparison fails (the test can fail)
reps[other].kill9()
reps[other] = Server(other.upper() + "x", model, reps[other].port, "--store", PG_URI, "--inject",
                     "rebuild-drop-token")
time.sleep(1.0)
reps[victim].kill9()  # everything now goes to the faulty replica, which must rebuild every session
same = round_(5, "faulty rebuild", only=set(moved))
check(moved and same < len(moved), f"a replica with --inject rebuild-drop-token matched the reference on "
                                   f"{same}/{len(moved)} sessions it rebuilt (expected fewer)")
print(f"  retries through the balancer: {retries}", flush=True)
finish()
