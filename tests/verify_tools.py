#!/usr/bin/env python3
"""Verification records of forced tool calls (run by tests/t_tools.sh against its tools server).

Replies decoded under a named tool_choice or tool_choice "required" carry a record of the constraint
(src/server/constraint.c): the record must say what the request asked, written out here by hand (the
functions' names and parameters, the tool_choice, parallel_tool_calls), and re-running it must match,
through POST /v1/verify and through `isobatch verify` in a process of its own. A record whose
constraint was edited so the reply's tokens cannot come (a schema property renamed, the called function
removed, parallel_tool_calls turned off under a two-call reply) must not match, diverging no later than
the token that the edit refuses; malformed constraints are refused (400 naming verification, exit 2,
one line naming the field).
Usage: verify_tools.py URL BIN MODEL_DIR WORKDIR TOOLS_JSON FORCED_BODY... -- REQUIRED_BODY... -- PARALLEL_OFF_BODY...
"""
import copy
import json
import os
import sys

import harness
from harness import bad, check, finish, http_json

harness.NAME = "verify_tools"
U, BIN, MODEL, T, TOOLS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
groups = [[]]
for a in sys.argv[6:]:
    if a == "--":
        groups.append([])
    else:
        groups[-1].append(a)
forced_files, required_files, paroff_files = (groups + [[], [], []])[:3]
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}, "required": ["city"],
        "additionalProperties": False}


def load(f):
    with open(f) as fh:
        return json.load(fh)


def cli(rec):
    return harness.verify_cli(BIN, MODEL, rec, os.path.join(T, "vt_rec.json"))


def step_reaching(body, n):
    """the index of the reply's token whose bytes bring the reply's text to n bytes or more"""
    acc = 0
    for k, e in enumerate(body["choices"][0]["logprobs"]["content"]):
        acc += len(bytes(e["bytes"]))
        if acc >= n:
            return k
    return None


def holds(name, rec, use_cli):
    st, res = http_json(U, "POST", "/v1/verify", rec)
    check(st == 200 and res.get("match") is True, f"{name}: /v1/verify {st} {res}")
    if use_cli:
        rc, res, err = cli(rec)
        check(rc == 0 and res and res.get("match") is True, f"{name}: isobatch verify exit {rc} {res} {err.strip()[:300]}")


def diverges(name, rec, last_step):
    st, res = http_json(U, "POST", "/v1/verify", rec)
    k = res.get("first_diverging_step") if st == 200 else None
    check(st == 200 and res.get("match") is False and isinstance(k, int) and 0 <= k <= last_step,
          f"{name}: /v1/verify {st} {res} (want no match at a step <= {last_step})")
    rc, cres, err = cli(rec)
    check(rc == 1 and cres and cres.get("first_diverging_step") == k, f"{name}: isobatch verify exit {rc} {cres} {err.strip()[:300]}")


def refused(name, rec, field):
    st, res = http_json(U, "POST", "/v1/verify", rec)
    msg = (res or {}).get("error", {}).get("message", "")
    check(st == 400 and res["error"].get("param") == "verification" and field in msg and "\n" not in msg,
          f"{name}: /v1/verify {st} {res} (want 400 naming {field})")
    rc, _, err = cli(rec)
    check(rc == 2 and len(err.strip().splitlines()) == 1 and field in err, f"{name}: isobatch verify exit {rc} {err!r}")


def is_call(body):
    return body["choices"][0]["finish_reason"] == "tool_calls"


want_tools = [{"type": "function", "function": {"name": t["function"]["name"], "parameters": t["function"]["parameters"]}}
              for t in TOOLS]
required = [b for b in map(load, required_files) if is_call(b)]
paroff = [b for b in map(load, paroff_files) if is_call(b)]

# ---- a named tool_choice: the record holds that function (name, parameters) and the choice
forced = [b for b in map(load, forced_files) if is_call(b)]
check(len(forced) >= 2, f"forced calls to verify: {len(forced)}")
for i, b in enumerate(forced):
    rec = b["verification"]
    want = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    got = {k: rec.get(k) for k in ("tools", "tool_choice")}
    check(got == want and "response_format" not in rec and "parallel_tool_calls" not in rec and rec.get("stop_ids"),
          f"forced call {i}: the record's constraint {json.dumps(got)[:400]} (response_format {rec.get('response_format')})")
    holds(f"forced call {i}", rec, i < 2)
if not (forced and "tools" in forced[0]["verification"]) or not required or "tools" not in required[0]["verification"]:
    bad("no records with tools to edit: the edits below cannot run")
    finish()
b = forced[0]
rec = b["verification"]
# the property renamed: the reply's key "city" cannot be written; diverges by the token bringing the
# text to its 'c' ('{"c' at the least; whitespace only makes it later)
text = "".join(e["token"] for e in b["choices"][0]["logprobs"]["content"])
y = copy.deepcopy(rec)
p = y["tools"][0]["function"]["parameters"]
p["properties"] = {"town": p["properties"]["city"]}
p["required"] = ["town"]
diverges("forced call, property renamed", y, step_reaching(b, text.index('"city"') + 2))
# the chosen city taken out of the enum
city = json.loads(b["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"]
y = copy.deepcopy(rec)
y["tools"][0]["function"]["parameters"]["properties"]["city"]["enum"] = [c for c in ("Paris", "Rome", "Oslo", "Lima") if c != city]
diverges(f"forced call, {city} out of the enum", y, step_reaching(b, text.index('"' + city) + 1 + len(city)))

# ---- tool_choice "required": every function (name, parameters), the choice, parallel_tool_calls
check(len(required) >= 2 and len(paroff) >= 2, f"required replies to verify: {len(required)}, parallel off {len(paroff)}")
for i, (b, par) in enumerate([(b, True) for b in required] + [(b, False) for b in paroff]):
    rec = b["verification"]
    got = {k: rec.get(k) for k in ("tools", "tool_choice", "parallel_tool_calls")}
    check(got == {"tools": want_tools, "tool_choice": "required", "parallel_tool_calls": par} and "response_format" not in rec,
          f"required reply {i}: the record's constraint {json.dumps(got)[:400]}")
    holds(f"required reply {i} (parallel {par})", rec, i % 3 == 0)
b = required[0]
rec = b["verification"]
name = b["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
y = copy.deepcopy(rec)
y["tools"] = [t for t in y["tools"] if t["function"]["name"] != name]
diverges(f"required reply, {name} removed from tools", y, step_reaching(b, len(name)))
two = [b for b in required if len(b["choices"][0]["message"]["tool_calls"]) >= 2]
if check(len(two) > 0, "a two-call reply among the required ones"):
    b = two[0]
    y = copy.deepcopy(b["verification"])
    y["parallel_tool_calls"] = False  # the reply must end after the first call's arguments
    text = "".join(e["token"] for e in b["choices"][0]["logprobs"]["content"])
    diverges("two calls, parallel_tool_calls made false", y, step_reaching(b, text.index("</tool_call>")))

# ---- malformed constraints: refused, naming the field
base = required[0]["verification"]
f0 = forced[0]["verification"]
for nm, mut, field in (
        ("tool_choice auto", lambda y: y.__setitem__("tool_choice", "auto"), "verification.tool_choice"),
        ("tool_choice none", lambda y: y.__setitem__("tool_choice", "none"), "verification.tool_choice"),
        ("no tool_choice", lambda y: y.pop("tool_choice"), "verification.tool_choice"),
        ("required without parallel_tool_calls", lambda y: y.pop("parallel_tool_calls"), "verification.parallel_tool_calls"),
        ("parallel_tool_calls not a boolean", lambda y: y.__setitem__("parallel_tool_calls", 1), "verification.parallel_tool_calls"),
        ("no tools", lambda y: y.pop("tools"), "verification.tools"),
        ("empty tools", lambda y: y.__setitem__("tools", []), "verification.tools"),
        ("tools not an array", lambda y: y.__setitem__("tools", {"a": 1}), "verification.tools"),
        ("two functions of one name", lambda y: y["tools"].append(copy.deepcopy(y["tools"][0])), "verification.tools"),
        ("a function without a name", lambda y: y["tools"][0]["function"].pop("name"), "verification.tools[0]"),
        ("parameters outside the subset", lambda y: y["tools"][0]["function"]["parameters"]["properties"].__setitem__(
            "z", {"type": "string", "pattern": "x"}), "verification.tools"),
        ("a response_format besides tools", lambda y: y.__setitem__("response_format", "json_object"), "verification.response_format")):
    y = copy.deepcopy(base)
    mut(y)
    refused(f"bad record: {nm}", y, field)
for nm, mut, field in (
        ("a named tool_choice of a function not in tools", lambda y: y["tool_choice"]["function"].__setitem__("name", "get_time"),
         "verification.tool_choice"),
        ("a named tool_choice with parallel_tool_calls", lambda y: y.__setitem__("parallel_tool_calls", True),
         "verification.parallel_tool_calls"),
        ("a named tool_choice of another shape", lambda y: y["tool_choice"].__setitem__("extra", 1), "verification.tool_choice")):
    y = copy.deepcopy(f0)
    mut(y)
    refused(f"bad record: {nm}", y, field)
finish()
