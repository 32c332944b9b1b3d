#!/usr/bin/env python3
"""Replay verification (run by tests/t_verify.sh; python3 standard library only).

A server on the tiny model answers a mix of requests at once — completions (text and token prompts,
greedy, seeded, logit_bias, repetition penalty, several prompts), chat (plain, streamed, JSON mode, a
json_schema response_format) and
session generations (full and sink+window, across several turns) — and every response's verification
record must verify, through POST /v1/verify and through `isobatch verify` (alone, in another process).
Tampered records (a changed token, seed, prompt token, history token, digest) must not, and must name
the first diverging step; so must a json_schema record whose schema was edited, and a malformed
constraint is refused naming its field. A server with an invariance fault (gemv-gemm) makes records that the clean
CLI must reject. Bad records: one-line errors, 400/409, exit 2.
Usage: verify_serve.py BIN WORKDIR
"""
import copy
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import harness
from harness import ok, bad, check, finish, procs

BIN, T = sys.argv[1], sys.argv[2]
harness.NAME = "t_verify"


def start(name, model, *args):
    port_file = os.path.join(T, name + ".port")
    log = os.path.join(T, name + ".log")
    p = subprocess.Popen([BIN, "serve", "-m", model, "--port", "0", "--port-file", port_file, "--threads", "2",
                          "--no-request-log", "--prefill-chunk", "8", "--max-batch", "16", "--store", "none", *args], stderr=open(log, "ab"))
    procs.append(p)
    for _ in range(200):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            return p, "http://127.0.0.1:%d" % int(open(port_file).read())
        time.sleep(0.05)
    print(open(log).read()[-2000:])
    bad(f"{name}: server did not start")
    finish()


def req(url, method, path, body=None, raw=False):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=60) as f:
            b = f.read()
            return f.status, (b.decode() if raw else json.loads(b))
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except Exception:
            return e.code, None


def record_of(status, body):
    """the verification record of a response (the final chunk of a stream)"""
    if status != 200:
        return None
    if isinstance(body, str):  # SSE
        last = None
        for line in body.splitlines():
            if line.startswith("data: {"):
                j = json.loads(line[6:])
                if j.get("verification"):
                    last = j["verification"]
        return last
    if body.get("verification"):
        return body["verification"]
    return [c.get("verification") for c in body.get("choices", [])]


def cli_verify(model, rec):
    return harness.verify_cli(BIN, model, rec, os.path.join(T, "rec%d.json" % threading.get_ident()), 120)


model = os.path.join(T, "tiny")
other = os.path.join(T, "tiny10")
subprocess.run([BIN, "mkmodel", "--preset", "tiny", "--seed", "9", "--out", model], check=True, stdout=subprocess.DEVNULL)
subprocess.run([BIN, "mkmodel", "--preset", "tiny", "--seed", "10", "--out", other], check=True, stdout=subprocess.DEVNULL)


# a json_schema response_format (its record holds it as sent); whitespace made less likely, so the
# random model reaches the keys within max_tokens
SCHEMA_RF = {"type": "json_schema", "json_schema": {"name": "pair", "strict": True, "schema": {
    "type": "object", "properties": {"alpha": {"type": "integer"}, "beta": {"enum": ["x", "y"]}},
    "required": ["alpha", "beta"], "additionalProperties": False}}}
WS_BIAS = {"9": -3, "10": -3, "13": -3, "32": -3}


def workload(url, records, prefix="", k=0):
    """a mix of requests at once (seeds offset by 1000 k); each response's records appended to records"""
    M = "tiny"
    reqs = []
    for i in range(4):
        reqs.append(("POST", "/v1/completions", {"model": M, "prompt": "In the beginning %d" % i, "max_tokens": 12,
                                                 "seed": 1000 * k + 40 + i, "temperature": 0.8, "top_p": 0.9}, False))
    reqs.append(("POST", "/v1/completions", {"model": M, "prompt": [5, 6, 7, 8, 9, 10, 11], "max_tokens": 10,
                                             "temperature": 0}, False))
    reqs.append(("POST", "/v1/completions", {"model": M, "prompt": "bias", "max_tokens": 10, "seed": 1000 * k + 3, "temperature": 1.0,
                                             "logit_bias": {"65": 5, "66": -100}, "repetition_penalty": 1.4}, False))
    reqs.append(("POST", "/v1/completions", {"model": M, "prompt": ["one", "two words", "three more words"],
                                             "max_tokens": 6, "seed": 1000 * k + 8, "temperature": 0.7}, False))
    reqs.append(("POST", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "hello"}],
                                                  "max_tokens": 9, "seed": 1000 * k + 5, "temperature": 0.9}, False))
    reqs.append(("POST", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "stream me"}],
                                                  "max_tokens": 9, "seed": 1000 * k + 6, "temperature": 0.9, "stream": True}, True))
    reqs.append(("POST", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "json"}],
                                                  "max_tokens": 14, "seed": 1000 * k + 7, "temperature": 1.0,
                                                  "response_format": {"type": "json_object"}}, False))
    reqs.append(("POST", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "schema"}],
                                                  "max_tokens": 24, "seed": 1000 * k + 9, "temperature": 1.0,
                                                  "logit_bias": WS_BIAS, "response_format": SCHEMA_RF}, False))
    out = []

    def one(r):
        st, body = req(url, r[0], r[1], r[2], raw=r[3])
        out.append((r, st, body))

    def session(kv, turns):
        st, s = req(url, "POST", "/v1/sessions", {"kv": kv} if kv else {})
        if st != 200:
            out.append((("session", kv), st, s))
            return
        for t in range(turns):
            req(url, "POST", f"/v1/sessions/{s['id']}/append", {"tokens": [(t * 17 + j) % 200 + 1 for j in range(12)]})
            st, body = req(url, "POST", f"/v1/sessions/{s['id']}/generate",
                           {"max_tokens": 8, "seed": 1000 * k + 100 + t, "temperature": 0.9, "repetition_penalty": 1.3})
            out.append((("session", kv, t), st, body))

    th = [threading.Thread(target=one, args=(r,)) for r in reqs]
    th += [threading.Thread(target=session, args=(kv, 4)) for kv in (None, "sink:4,window:20")]
    for t in th:
        t.start()
    for t in th:
        t.join()
    for r, st, body in out:
        rec = record_of(st, body)
        if not check(rec is not None and rec != [], f"{prefix}{r}: no record: {st} {str(body)[:300]}"):
            continue
        for x in (rec if isinstance(rec, list) else [rec]):
            check(isinstance(x, dict) and x.get("contract") == 1, f"{prefix}{r}: record {x}")
            records.append((r, x))


p, U = start("S", model, "--max-queue", "512")
st, body = req(U, "POST", "/v1/completions", {"model": "tiny", "prompt": "fp", "max_tokens": 2, "seed": 1})
fp = body.get("system_fingerprint", "") if st == 200 else ""
check(fp.startswith("sha256:") and fp.endswith("/contract-1") and fp.startswith(body["verification"]["model"]),
      f"system_fingerprint {fp}")
records = []
# ten mixed workloads at once (200 responses with records, sessions included), all under load
wl = [threading.Thread(target=workload, args=(U, records, f"workload {k}: ", k)) for k in range(10)]
for t in wl:
    t.start()
for t in wl:
    t.join()
check(len(records) >= 200, f"{len(records)} records")
print(f"  {len(records)} records from 10 concurrent mixed workloads", flush=True)

# every record verifies, on the server (as jobs among others, all at once) and alone in a CLI process
vres = []


def sv(rec):
    vres.append((rec, req(U, "POST", "/v1/verify", rec)))


th = [threading.Thread(target=sv, args=(x,)) for _, x in records]
for t in th:
    t.start()
for t in th:
    t.join()
for rec, (st, res) in vres:
    check(st == 200 and res.get("match") is True and res.get("first_diverging_step") is None,
          f"/v1/verify of a true record: {st} {res} (kv {rec.get('kv')}, {len(rec['tokens'])} tokens)")
matched = sum(1 for _, (st, res) in vres if st == 200 and res.get("match") is True)
print(f"  /v1/verify: {matched}/{len(vres)} records match", flush=True)
for r, x in records[::5]:  # every fifth also alone, in a CLI process of its own
    rc, res, err = cli_verify(model, x)
    check(rc == 0 and res and res["match"] is True, f"isobatch verify of {r}: exit {rc} {res} {err.strip()[:200]}")
# a whole response is a record too (the CLI reads its verification)
st, body = req(U, "POST", "/v1/completions", {"model": "tiny", "prompt": "whole", "max_tokens": 5, "seed": 2})
rc, res, err = cli_verify(model, body)
check(rc == 0, f"verify of a whole response: {rc} {err}")

# tampered records: no match, at the first diverging step
sampled = [x for r, x in records if x["sampling"]["temperature"] > 0 and len(x["tokens"]) >= 6 and "history" not in x]
sess_rec = [x for r, x in records if "history" in x]
check(len(sampled) > 0 and len(sess_rec) > 0, "records to tamper with")


def tamper_check(name, rec, want_step):
    st, res = req(U, "POST", "/v1/verify", rec)
    check(st == 200 and res.get("match") is False and (want_step is None or res.get("first_diverging_step") == want_step)
          and isinstance(res.get("first_diverging_step"), int) and "expected" in res and "got" in res,
          f"{name}: /v1/verify {st} {res} (want step {want_step})")
    rc, cres, err = cli_verify(model, rec)
    check(rc == 1 and cres and cres["match"] is False and cres["first_diverging_step"] == res.get("first_diverging_step"),
          f"{name}: isobatch verify exit {rc} {cres} {err.strip()[:200]}")
    r = subprocess.run([BIN, "verify", "-m", model, os.path.join(T, "rec%d.json" % threading.get_ident())],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 1 and r.stdout.startswith("no match: first diverging step %s" % res.get("first_diverging_step")),
          f"{name}: plain output {r.stdout!r}")


for x in sampled[:2]:
    y = copy.deepcopy(x)
    y["tokens"][3] = (y["tokens"][3] + 1) % 256
    tamper_check("changed token 3", y, 3)
    y = copy.deepcopy(x)
    y["sampling"]["seed"] += 1
    tamper_check("changed seed", y, None)
    y = copy.deepcopy(x)
    y["prompt"][0] = (y["prompt"][0] + 1) % 256
    tamper_check("changed prompt token", y, 0)
    y = copy.deepcopy(x)
    y["step_digests"][4] = "%016x" % (int(y["step_digests"][4], 16) ^ 1)
    if len(y["step_digests"]) == 5:
        y["digest"] = y["step_digests"][4]
    tamper_check("changed digest 4", y, 4)
y = copy.deepcopy(sess_rec[-1])
y["history"][1] = (y["history"][1] + 1) % 256
tamper_check("changed session history", y, 0)
y = copy.deepcopy(sess_rec[-1])
y["draws"] = y.get("draws", 0) + 1
tamper_check("changed draw counter", y, None)
y = copy.deepcopy(sampled[0])
check(y.get("kv_dtype") == "f32", f"record of a float32-KV server: kv_dtype {y.get('kv_dtype')}")
y["kv_dtype"] = "q8"   # re-run with 8-bit KV: other logits from the first step
tamper_check("changed KV type", y, 0)

# json_schema records: the request's response_format as sent, matching (above); the schema edited so
# the reply's first key cannot be written (both properties renamed) diverges by the token that wrote
# its first letter; the old form of such a record ("json_object") is read as json_object
srec = [x for r, x in records if isinstance(r[2], dict) and r[2].get("response_format") == SCHEMA_RF]
check(len(srec) >= 10 and all(x.get("response_format") == SCHEMA_RF and x.get("stop_ids") for x in srec),
      f"json_schema records: {len(srec)}, {[x.get('response_format') for x in srec[:2]]}")
def key_step(rec):
    """the step whose token wrote the reply's first key letter (the text through it holds '"a' or
    '"b'; read back through /detokenize), or None when the reply stopped before it"""
    for k in range(len(rec["tokens"])):
        st, d = req(U, "POST", "/detokenize", {"tokens": rec["tokens"][:k + 1]})
        if st == 200 and ('"a' in d.get("content", "") or '"b' in d.get("content", "")):
            return k
    return None


keyed = [(x, key_step(x)) for x in srec[:6]]
keyed = [(x, k) for x, k in keyed if k is not None]
if check(len(keyed) > 0, "a json_schema reply that reached its first key"):
    y = copy.deepcopy(keyed[0][0])
    sc = y["response_format"]["json_schema"]["schema"]
    sc["properties"] = {"gamma": sc["properties"]["alpha"], "delta": sc["properties"]["beta"]}
    sc["required"] = ["gamma", "delta"]
    tamper_check("json_schema with its properties renamed", y, None)
    st, res = req(U, "POST", "/v1/verify", y)
    check(st == 200 and isinstance(res.get("first_diverging_step"), int) and res["first_diverging_step"] <= keyed[0][1],
          f"renamed properties diverge by the first key's letter (step {keyed[0][1]}): {res}")
    y = copy.deepcopy(keyed[0][0])
    y["response_format"]["json_schema"]["schema"]["properties"]["beta"]["enum"] = ["z"]
    st, res = req(U, "POST", "/v1/verify", y)
    check(st == 200 and isinstance(res.get("match"), bool), f"an edited enum re-runs: {st} {res}")
    y = copy.deepcopy(keyed[0][0])
    y["response_format"] = "json_object"
    st, res = req(U, "POST", "/v1/verify", y)
    check(st == 200 and isinstance(res.get("match"), bool), f"a record in the old form (json_object) re-runs: {st} {res}")

# bad records: 400 naming verification; another model: 409 / exit 2; not JSON: exit 2, one line
x = sampled[0]
for name, mut in (("no tokens", lambda y: y.pop("tokens")), ("bad act", lambda y: y.__setitem__("act", "f64")),
                  ("token out of range", lambda y: y["tokens"].__setitem__(0, 1 << 20)),
                  ("digest count", lambda y: y["step_digests"].pop()), ("contract", lambda y: y.__setitem__("contract", 99)),
                  ("bad kv", lambda y: y.__setitem__("kv", "window:-1")),
                  ("bad kv_dtype", lambda y: y.__setitem__("kv_dtype", "q4"))):
    y = copy.deepcopy(x)
    mut(y)
    st, res = req(U, "POST", "/v1/verify", y)
    check(st == 400 and res and res["error"]["param"] == "verification", f"bad record {name}: {st} {res}")
    rc, _, err = cli_verify(model, y)
    check(rc == 2 and len(err.strip().splitlines()) == 1, f"CLI bad record {name}: exit {rc} {err!r}")
# bad constraints: 400 / exit 2, one line naming the field
if srec:
    sx = srec[0]
    for name, mut, field in (
            ("response_format text", lambda y: y.__setitem__("response_format", {"type": "text"}), "verification.response_format"),
            ("response_format a number", lambda y: y.__setitem__("response_format", 5), "verification.response_format"),
            ("response_format json_schema as a string", lambda y: y.__setitem__("response_format", "json_schema"),
             "verification.response_format"),
            ("a schema keyword outside the subset", lambda y: y["response_format"]["json_schema"]["schema"]["properties"]["beta"]
             .__setitem__("pattern", "x"), "verification.response_format.json_schema.schema"),
            ("a schema type unknown", lambda y: y["response_format"]["json_schema"]["schema"].__setitem__("type", "thing"),
             "verification.response_format.json_schema.schema"),
            ("a json_schema without its schema", lambda y: y["response_format"]["json_schema"].pop("schema"),
             "verification.response_format.json_schema"),
            ("tool_choice without tools", lambda y: y.__setitem__("tool_choice", "required"), "verification.tools"),
            ("a stop id out of range", lambda y: y["stop_ids"].__setitem__(0, 1 << 20), "verification.stop_ids")):
        y = copy.deepcopy(sx)
        mut(y)
        st, res = req(U, "POST", "/v1/verify", y)
        msg = (res or {}).get("error", {}).get("message", "")
        check(st == 400 and res["error"]["param"] == "verification" and field in msg and "\n" not in msg,
              f"bad constraint {name}: {st} {res}")
        rc, _, err = cli_verify(model, y)
        check(rc == 2 and len(err.strip().splitlines()) == 1 and field in err, f"CLI bad constraint {name}: exit {rc} {err!r}")
y = copy.deepcopy(x)
y["model"] = "sha256:" + "0" * 64
st, res = req(U, "POST", "/v1/verify", y)
check(st == 409 and res["error"]["code"] == "model_mismatch", f"other model's record: {st} {res}")
rc, _, err = cli_verify(other, x)
check(rc == 2 and "record was made by model" in err and len(err.strip().splitlines()) == 1, f"CLI, other model: {rc} {err!r}")
st, res = req(U, "POST", "/v1/verify", {"hello": 1})
check(st == 400, f"not a record: {st}")
with open(os.path.join(T, "junk.json"), "w") as fh:
    fh.write("{not json")
r = subprocess.run([BIN, "verify", "-m", model, os.path.join(T, "junk.json")], capture_output=True, text=True)
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, f"CLI junk: {r.returncode} {r.stderr!r}")
r = subprocess.run([BIN, "verify", "-m", model, os.path.join(T, "missing.json")], capture_output=True, text=True)
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, f"CLI missing file: {r.returncode} {r.stderr!r}")
p.terminate()
check(p.wait(timeout=30) == 0, "server stop")
log = open(os.path.join(T, "S.log")).read()
check("Sanitizer" not in log and "runtime error" not in log, "sanitizer report: " + log[-1500:])

# a server keeping 8-bit KV: its records say so and verify, batched under load or alone
p, U = start("Q8", model, "--kv-dtype", "q8")
qrec = []
workload(U, qrec, "q8 KV: ")
check(len(qrec) > 0 and all(x.get("kv_dtype") == "q8" for _, x in qrec), f"q8 server records: {len(qrec)}")
qres = [req(U, "POST", "/v1/verify", x) for _, x in qrec[::4]]
check(all(st == 200 and res.get("match") is True for st, res in qres),
      f"q8 records on /v1/verify: {sum(1 for st, res in qres if st == 200 and res.get('match') is True)} of {len(qres)} match")
for _, x in qrec[::10]:
    rc, res, err = cli_verify(model, x)
    check(rc == 0 and res and res["match"] is True, f"isobatch verify of a q8 record: exit {rc} {res} {err.strip()[:200]}")
p.terminate()
check(p.wait(timeout=30) == 0, "q8 server stop")

# a server with an invariance fault: its batched records must fail the clean re-run
p, U = start("F", model, "--inject", "gemv-gemm")
frec = []
workload(U, frec, "faulty: ")
n_bad = sum(1 for _, x in frec if cli_verify(model, x)[0] == 1)
check(n_bad > 0, f"records of a server with the gemv-gemm fault: {n_bad} of {len(frec)} fail the clean re-run")
p.terminate()
p.wait(timeout=30)
finish()
