#!/usr/bin/env python3
"""Gemma 4's tool form: the prompt isobatch writes against the one Gemma 4's own chat template writes.

usage: python3 bench/gemma4_tools_vs_template.py TEMPLATE [--cases N] [--seed S] [--bin build/isobatch]

TEMPLATE is a Gemma 4 chat template (chat_template.jinja, or a tokenizer_config.json holding one),
which this repository does not carry. Random conversations — tools with random JSON Schemas, assistant
calls with random arguments, tool results (JSON or plain text), chains of calls and results, answers,
thinking on and off — are written by the template (Python's jinja2, as transformers renders it, with
the OpenAI messages turned into the template's own: arguments as objects, tool results as the
tool_responses of the calls' message, the next answer merged into that turn) and by
`isobatch tokenize --messages M --tools T --render` over a byte-level tokenizer holding Gemma 4's
special tokens and that template. Prints how many gave the same text, how many differ (the first few
shown; the exit status is 1 then), how many both refused (the template raising, isobatch refusing with
a message), and how many the template stopped on where isobatch wrote a prompt (a property without a
type, which some Gemma 4 templates stop on and others write with an empty type, as isobatch does).

One difference is isobatch's on purpose and applied to the template's text before comparing: after a
model turn that has tool results and an answer, the template writes no new `<|turn>model` header for
the generation prompt; isobatch does (a turn left open after results only is continued, as both do).
Needs jinja2 (pip install jinja2, or Debian's python3-jinja2).
"""
import argparse, json, os, random, subprocess, sys, tempfile

SPECIALS = ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "<|tool>", "<tool|>",
            "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>']
WORDS = ["city", "City", "unit", "Zeta", "alpha", "Alpha", "query", "limit", "\u00e9tat", "x_y", "opts", "tags", "n"]


def tokenizer_dir(binary, template, where):
    """A byte-level tokenizer (the tiny preset's) with Gemma 4's special tokens added, and template."""
    subprocess.run([binary, "mkmodel", "--preset", "tiny", "--out", where + "/m"], check=True, capture_output=True)
    t = json.load(open(where + "/m/tokenizer.json"))
    nid = max(a["id"] for a in t["added_tokens"]) + 1
    for i, s in enumerate(SPECIALS):
        t["added_tokens"].append({"id": nid + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": True})
    os.makedirs(where + "/tok", exist_ok=True)
    json.dump(t, open(where + "/tok/tokenizer.json", "w"))
    json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template}, open(where + "/tok/tokenizer_config.json", "w"))
    return where + "/tok/tokenizer.json"


class Cases:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def text(self):
        return self.r.choice(["", "London", "a b", "\u00dcn\u00efcode \u2713", 'quote"s', "x,y:z", "  pad  ", "{braces}", "line\nbreak"])

    def number(self):
        return self.r.choice([0, 1, -7, 123456789, 0.5, 1.0, -0.0, 1e-05, 0.0001, 1e16, 1.5e16, 123.456, 2.5e-300, 1e300])

    def value(self, d=0):
        k = self.r.randrange(8 if d < 3 else 5)
        if k == 0: return self.text()
        if k == 1: return self.number()
        if k == 2: return self.r.choice([True, False])
        if k == 3: return None
        if k == 4: return self.r.randrange(-5, 100)
        if k == 5: return [self.value(d + 1) for _ in range(self.r.randrange(4))]
        return {self.r.choice(WORDS): self.value(d + 1) for _ in range(self.r.randrange(4))}

    def schema(self, d=0):
        r = self.r
        t = r.choice(["string", "number", "integer", "boolean", "object", "array"] if d < 3 else ["string", "number"])
        s = {"type": t if r.random() < 0.85 else [t, "null"]}
        if r.random() < 0.6: s["description"] = self.text() or "desc"
        if r.random() < 0.2: s["nullable"] = r.choice([True, False])
        if t == "string" and r.random() < 0.4: s["enum"] = [self.text() for _ in range(r.randrange(1, 4))]
        if t == "object" and r.random() < 0.8:
            s["properties"] = {r.choice(WORDS): self.schema(d + 1) for _ in range(r.randrange(0, 4))}
            if s["properties"] and r.random() < 0.5: s["required"] = list(s["properties"])[:1]
        if r.random() < 0.03: del s["type"]                      # the template cannot write these:
        if t == "object" and r.random() < 0.05 and "properties" in s:   # both must refuse
            s = {"type": "object", "additionalProperties": False}
        if t == "array" and r.random() < 0.8:
            it = {"type": r.choice(["string", "number", "object"])}
            if it["type"] == "object" and r.random() < 0.7:
                it["properties"] = {r.choice(WORDS): self.schema(d + 1) for _ in range(r.randrange(1, 3))}
                if r.random() < 0.5: it["required"] = list(it["properties"])[:1]
            if r.random() < 0.3: it["type"] = [it["type"], "null"]
            if r.random() < 0.3: it["description"] = self.text()
            if r.random() < 0.2: it["minimum"] = self.number()
            if r.random() < 0.1: it["enum"] = [self.value(2) for _ in range(2)]
            s["items"] = it
        return s

    def tool(self, i):
        r = self.r
        f = {"name": "fn_%d%s" % (i, r.choice(["", "X", "-a"]))}
        if r.random() < 0.8: f["description"] = self.text() or "Does things."
        if r.random() < 0.9:
            p = {}
            if r.random() < 0.9: p["type"] = "object"
            if r.random() < 0.85: p["properties"] = {r.choice(WORDS): self.schema() for _ in range(r.randrange(0, 5))}
            if p.get("properties") and r.random() < 0.6: p["required"] = list(p["properties"])[:2]
            f["parameters"] = p
        return {"type": "function", "function": f}

    def case(self):
        r = self.r
        tools = [self.tool(i) for i in range(r.randrange(0, 4))]
        names = [t["function"]["name"] for t in tools] or ["lookup"]
        msgs = []
        if r.random() < 0.6: msgs.append({"role": r.choice(["system", "developer"]), "content": r.choice(["Be brief. ", "  You help.\n", ""])})
        msgs.append({"role": "user", "content": r.choice(["What is the weather?", " hi ", "Use the tools."])})
        rounds = r.randrange(0, 3)
        for k in range(rounds):
            calls = [{"id": "c%d%d" % (k, j), "type": "function",
                      "function": {"name": r.choice(names), "arguments": json.dumps({r.choice(WORDS): self.value() for _ in range(r.randrange(0, 4))})}}
                     for j in range(r.randrange(1, 3))]
            msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            if r.random() < 0.9:
                for c in calls:
                    content = r.choice([json.dumps(self.value()), json.dumps({"temp": self.number(), "ok": True}), "plain text result", "15", "null"])
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": content})
            if r.random() < 0.5 and k == rounds - 1:
                msgs.append({"role": "assistant", "content": r.choice(["It is sunny.", " <|channel>thought\nhm<channel|>Done. "])})
                if r.random() < 0.5: msgs.append({"role": "user", "content": "Thanks"})
        return tools, msgs, r.random() < 0.2


def template_messages(msgs):
    """OpenAI messages as the template takes them (see the module's text)."""
    out, i = [], 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant" or not m.get("tool_calls"):
            out.append(dict(m))
            i += 1
            continue
        calls = m["tool_calls"]
        turn = {"role": "assistant", "tool_calls": [{"function": {"name": c["function"]["name"],
                                                                  "arguments": json.loads(c["function"]["arguments"])}} for c in calls]}
        i += 1
        results = []
        while i < len(msgs) and msgs[i]["role"] == "tool":
            t = msgs[i]
            name = next((c["function"]["name"] for c in calls if c.get("id") == t.get("tool_call_id")), None)
            if name is None:
                name = calls[len(results)]["function"]["name"] if len(results) < len(calls) else t.get("tool_call_id", "unknown")
            try:
                value = json.loads(t["content"])
            except ValueError:
                value = t["content"]
            results.append({"name": name, "response": value})
            i += 1
        content = m.get("content") or ""
        if results:
            turn["tool_responses"] = results
            if not content and i < len(msgs) and msgs[i]["role"] == "assistant" and not msgs[i].get("tool_calls") and msgs[i].get("content"):
                content = msgs[i]["content"]
                i += 1
        turn["content"] = content
        out.append(turn)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("template")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "isobatch"))
    ap.add_argument("--show", type=int, default=3, help="differences printed in full")
    a = ap.parse_args()
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        sys.exit("gemma4_tools_vs_template: needs jinja2 (pip install jinja2, or apt-get install python3-jinja2)")
    text = open(a.template, encoding="utf-8").read()
    if a.template.endswith(".json"):
        text = json.loads(text)["chat_template"]
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    gen = Cases(a.seed)
    same = differ = refused = lenient = 0
    with tempfile.TemporaryDirectory() as d:
        tok = tokenizer_dir(a.bin, text, d)
        for _ in range(a.cases):
            tools, msgs, think = gen.case()
            try:
                kw = dict(messages=template_messages(msgs), tools=tools or None, bos_token="<bos>", add_generation_prompt=False)
                if think: kw["enable_thinking"] = True
                want = template.render(**kw)
                want += ("" if want.endswith("<tool_response|>") else "<|turn>model\n") + ("" if think else "<|channel>thought\n<channel|>")
            except Exception as e:
                want = None
            json.dump(msgs, open(d + "/m.json", "w"))
            json.dump(tools, open(d + "/t.json", "w"))
            cmd = [a.bin, "tokenize", "--tokenizer", tok, "--messages", d + "/m.json", "--tools", d + "/t.json", "--render"]
            if think: cmd.append("--think")
            p = subprocess.run(cmd, capture_output=True)
            got = p.stdout.decode("utf-8") if p.returncode == 0 else None
            if want is None and got is None:
                refused += 1
            elif want is None:
                lenient += 1   # the template stopped (a property without a type, say); isobatch wrote it
            elif want == got:
                same += 1
            else:
                differ += 1
                if differ <= a.show:
                    print("case:", json.dumps({"tools": tools, "messages": msgs, "thinking": think}))
                    print("template:", repr(want))
                    print("isobatch:", repr(got) if got is not None else p.stderr.decode().strip())
    print("gemma4_tools_vs_template: %d cases: same %d, different %d, refused by both %d, template stopped where isobatch "
          "wrote %d" % (a.cases, same, differ, refused, lenient))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
