// Drives a running `isobatch serve` with the official openai npm client: models, completions and chat
// (plain and streaming, with logprobs), error classes, and invariance under load: the same greedy and
// seeded-sampling requests return bitwise-identical tokens and logprobs alone and among 31 concurrent
// others of varied lengths. Usage: node client_test.js BASE_URL API_KEY MODEL_ID
// Prints "PASS name" / "FAIL name: detail" lines (tests/t_serve.sh counts them).
const OpenAI = require("openai");
const [base, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
let fails = 0;
function check(name, cond, detail) {
  if (cond) console.log("PASS " + name);
  else { fails++; console.log("FAIL " + name + ": " + (detail || "")); }
}
// The parts of a completion that must not change: text, token ids, logprobs (as exact doubles).
function fingerprint(r) {
  const c = r.choices[0];
  const lp = c.logprobs ? (c.logprobs.token_logprobs || c.logprobs.content.map((e) => e.logprob)) : null;
  const ids = c.logprobs ? (c.logprobs.token_ids || c.logprobs.content.map((e) => e.token_id)) : null;
  return JSON.stringify({ text: c.text ?? c.message.content, lp, ids, finish: c.finish_reason });
}
// Whether v satisfies JSON Schema s (the subset the server supports), root for $ref.
function validate(v, s, root) {
  if (s === true || s === undefined) return true;
  if (s.$ref) return validate(v, s.$ref === "#" ? root : root.$defs[s.$ref.split("/").pop()], root);
  if (s.anyOf) return s.anyOf.some((a) => validate(v, a, root));
  const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
  if ("const" in s && !same(s.const, v)) return false;
  if (s.enum && !s.enum.some((e) => same(e, v))) return false;
  const kind = v === null ? "null" : Array.isArray(v) ? "array" : typeof v === "number" ? (Number.isInteger(v) ? "integer" : "number") : typeof v;
  if (s.type && ![].concat(s.type).some((t) => t === kind || (t === "number" && kind === "integer"))) return false;
  if (kind === "object") {
    for (const k of Object.keys(v)) {
      const ps = s.properties && s.properties[k];
      if (ps ? !validate(v[k], ps, root) : s.additionalProperties === false || (typeof s.additionalProperties === "object" && !validate(v[k], s.additionalProperties, root))) return false;
    }
    if ((s.required || []).some((k) => !(k in v))) return false;
  }
  if (kind === "array") {
    if (s.minItems !== undefined && v.length < s.minItems) return false;
    if (s.maxItems !== undefined && v.length > s.maxItems) return false;
    if (s.items && !v.every((x) => validate(x, s.items, root))) return false;
  }
  return true;
}
const words = "the quick brown fox jumps over the lazy dog while batching never changes an answer".split(" ");
function prompt(n) { let s = []; for (let i = 0; i < n; i++) s.push(words[(i * 7 + n) % words.length]); return s.join(" "); }

async function main() {
  const models = await client.models.list();
  check("models.list", models.data.length === 1 && models.data[0].id === model, JSON.stringify(models.data));

  const greedy = { model, prompt: "Hello there, isobatch", max_tokens: 24, temperature: 0, logprobs: 1 };
  const seeded = { model, prompt: "A seeded story:", max_tokens: 24, temperature: 0.9, top_p: 0.95, seed: 42, logprobs: 1 };
  const chatReq = { model, messages: [{ role: "user", content: "Say something." }], max_tokens: 16, temperature: 0.7, seed: 7, logprobs: true };
  const SCHEMA = { type: "object", additionalProperties: false, required: ["ok", "n", "color", "item"],
                  properties: { ok: { type: "boolean" }, n: { type: "integer" },
                                color: { type: "string", enum: ["red", "green", "blue"] },
                                tags: { type: "array", items: { enum: ["a", "b", 3, null] }, maxItems: 3 },
                                opt: { anyOf: [{ type: "null" }, { type: "number" }] },
                                item: { $ref: "#/$defs/item" } },
                  $defs: { item: { type: "object", properties: { id: { type: "integer" }, on: { const: true } },
                                   required: ["id"], additionalProperties: false } } };
  const FREE = { type: "object", properties: { name: { type: "string" }, x: { type: ["number", "null"] } }, required: ["name"] };
  const schemaReq = { model, messages: [{ role: "user", content: "Answer in JSON." }], max_tokens: 200, temperature: 0.9, seed: 5,
                      logit_bias: { 9: -3, 10: -3, 13: -3, 32: -3 }, // the random model would spend most tokens on whitespace
                      logprobs: true, response_format: { type: "json_schema", json_schema: { name: "answer", strict: true, schema: SCHEMA } } };
  const jsonReq = { model, messages: [{ role: "user", content: "Answer in JSON." }], max_tokens: 48, temperature: 0.8, seed: 11,
                    logprobs: true, response_format: { type: "json_object" } };

  const c1 = await client.completions.create(greedy);
  check("completions: text and usage", typeof c1.choices[0].text === "string" && c1.usage.completion_tokens > 0 &&
        c1.usage.prompt_tokens > 0 && ["stop", "length"].includes(c1.choices[0].finish_reason), JSON.stringify(c1));
  check("completions: logprobs per token", c1.choices[0].logprobs.token_logprobs.length === c1.choices[0].logprobs.tokens.length &&
        c1.choices[0].logprobs.token_logprobs.every((x) => x <= 0), JSON.stringify(c1.choices[0].logprobs));
  const c1b = await client.completions.create(greedy);
  check("completions: repeatable", fingerprint(c1) === fingerprint(c1b));

  let streamed = "", chunks = 0, fin = null;
  for await (const ch of await client.completions.create({ ...greedy, logprobs: null, stream: true })) {
    chunks++; streamed += ch.choices[0]?.text ?? ""; if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason;
  }
  check("completions stream: same text as plain", streamed === c1.choices[0].text && chunks > 1 && fin === c1.choices[0].finish_reason,
        JSON.stringify([streamed, c1.choices[0].text, chunks, fin]));

  const ch1 = await client.chat.completions.create(chatReq);
  check("chat: message", ch1.choices[0].message.role === "assistant" && typeof ch1.choices[0].message.content === "string" &&
        ch1.object === "chat.completion", JSON.stringify(ch1));
  check("chat: logprobs", Array.isArray(ch1.choices[0].logprobs.content) && ch1.choices[0].logprobs.content.length > 0);
  let cs = "", usage = null, role = null;
  const st = await client.chat.completions.create({ ...chatReq, logprobs: false, stream: true, stream_options: { include_usage: true } });
  for await (const ch of st) {
    if (ch.usage) usage = ch.usage;
    const d = ch.choices[0]?.delta; if (d?.role) role = d.role; if (d?.content) cs += d.content;
  }
  check("chat stream: same text as plain, usage at the end", cs === ch1.choices[0].message.content && role === "assistant" &&
        usage && usage.completion_tokens === ch1.usage.completion_tokens, JSON.stringify([cs, ch1.choices[0].message.content, usage]));

  // n choices streamed through the client: each index's deltas joined are that choice of the plain request
  const n3 = await client.chat.completions.create({ ...chatReq, logprobs: false, n: 3, seed: 7 });
  const nParts = ["", "", ""];
  for await (const ch of await client.chat.completions.create({ ...chatReq, logprobs: false, n: 3, seed: 7, stream: true }))
    for (const c of ch.choices) nParts[c.index] += c.delta?.content ?? "";
  check("chat n 3 stream: each index's text is the plain request's choice", n3.choices.length === 3 &&
        n3.choices.every((c, k) => c.index === k && c.message.content === nParts[k]), JSON.stringify([nParts, n3.choices.map(c => c.message.content)]));

  // errors through the client's classes
  try { await new OpenAI({ baseURL: base + "/v1", apiKey: "wrong-key", maxRetries: 0 }).models.list(); check("wrong key", false, "accepted"); }
  catch (e) { check("wrong key -> 401 AuthenticationError", e instanceof OpenAI.AuthenticationError && e.code === "invalid_api_key", String(e)); }
  try { await client.completions.create({ ...greedy, model: "no-such-model" }); check("unknown model", false, "accepted"); }
  catch (e) { check("unknown model -> 404 NotFoundError", e instanceof OpenAI.NotFoundError, String(e)); }
  try { await client.completions.create({ ...greedy, max_tokens: "many" }); check("wrong type", false, "accepted"); }
  catch (e) { check("wrong type -> 400 BadRequestError", e instanceof OpenAI.BadRequestError && e.param === "max_tokens", String(e)); }

  // what users touch: reported seeds, fields refused by name, logit_bias, content parts, several prompts
  const m1 = await client.models.retrieve(model);
  check("models.retrieve", m1.id === model && m1.object === "model", JSON.stringify(m1));
  const u1 = await client.completions.create({ model, prompt: "Unseeded:", max_tokens: 16, temperature: 1, logprobs: 1 });
  const u2 = await client.completions.create({ model, prompt: "Unseeded:", max_tokens: 16, temperature: 1, logprobs: 1 });
  check("unseeded: a fresh seed each time, reported", Number.isSafeInteger(u1.seed) && Number.isSafeInteger(u2.seed) &&
        u1.seed !== u2.seed && fingerprint(u1) !== fingerprint(u2), JSON.stringify([u1.seed, u2.seed]));
  const u3 = await client.completions.create({ model, prompt: "Unseeded:", max_tokens: 16, temperature: 1, logprobs: 1, seed: u1.seed });
  check("unseeded: the reported seed reproduces the answer", fingerprint(u3) === fingerprint(u1), fingerprint(u3) + " vs " + fingerprint(u1));
  async function refused(name, p, param) {
    try { await p; check(name, false, "accepted"); }
    catch (e) { check(name + " -> 400 naming " + param, e instanceof OpenAI.BadRequestError && e.param === param, String(e) + " param " + e.param); }
  }
  const chatBase = { model, messages: [{ role: "user", content: "hi" }], max_tokens: 4 };
  await refused("chat tools", client.chat.completions.create({ ...chatBase, tools: [{ type: "function", function: { name: "f", parameters: {} } }] }), "tools");
  await refused("chat json_schema with an unsupported keyword", client.chat.completions.create({ ...chatBase, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: { a: { type: "string", pattern: "^a" } } } } } }), "response_format");
  try { await client.chat.completions.create({ ...chatBase, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "integer", minimum: 1 } } } }); check("json_schema minimum", false, "accepted"); }
  catch (e) { check("json_schema: the 400 names the keyword", e instanceof OpenAI.BadRequestError && /'minimum'/.test(e.message) && e.code === "unsupported_parameter", String(e)); }
  // json_schema: the tiny model writes random text, so the constraint alone makes it valid; every reply
  // that ends with "stop" must parse and satisfy the schema (validate() below, written apart)
  let stops = 0, lengths = 0;
  for (let seed = 1; seed <= 8; seed++) {
    const r = await client.chat.completions.create({ ...schemaReq, seed, logprobs: false });
    const c = r.choices[0];
    if (c.finish_reason === "stop") {
      stops++;
      let v, err = "";
      try { v = JSON.parse(c.message.content); } catch (e) { err = String(e); }
      check("json_schema seed " + seed + ": a stopped reply parses and satisfies the schema", !err && validate(v, SCHEMA, SCHEMA), err + " " + c.message.content);
    } else lengths++;
  }
  check("json_schema: most replies complete (" + stops + " of 8 stop)", stops >= 4, "stops " + stops + ", lengths " + lengths);
  const fr = await client.chat.completions.create({ ...schemaReq, seed: 3, response_format: { type: "json_schema", json_schema: { name: "free", schema: FREE } } });
  check("json_schema with free strings: a JSON prefix, or valid when stopped", fr.choices[0].finish_reason !== "stop" ||
        validate(JSON.parse(fr.choices[0].message.content), FREE, FREE), fr.choices[0].message.content);
  // echo with logprobs through the client (scoring): the prompt's tokens first, the first one's logprob null
  const ec = await client.completions.create({ ...greedy, echo: true, logprobs: 1, max_tokens: 0 });
  const el = ec.choices[0].logprobs;
  check("completions echo, max_tokens 0: the prompt and its tokens' logprobs", ec.choices[0].text === greedy.prompt &&
        el.tokens.join("") === greedy.prompt && el.token_logprobs[0] === null && el.token_logprobs.slice(1).every((x) => x < 0) &&
        ec.usage.completion_tokens === 0, JSON.stringify(ec.choices[0]));
  await refused("completions best_of", client.completions.create({ ...greedy, best_of: 2 }), "best_of");
  await refused("completions suffix", client.completions.create({ ...greedy, suffix: "!" }), "suffix");
  await refused("unknown field", client.completions.create({ ...greedy, no_such_field: 1 }), "no_such_field");
  await refused("max_tokens 0", client.completions.create({ ...greedy, max_tokens: 0 }), "max_tokens");
  const lb = await client.completions.create({ ...greedy, max_tokens: 5, logit_bias: { "66": 100 } });
  check("logit_bias", lb.choices[0].logprobs.token_ids.every((t) => t === 66) && lb.choices[0].text === "BBBBB", JSON.stringify(lb.choices[0]));
  const parts = await client.chat.completions.create({ ...chatReq, messages: [{ role: "user", content: [{ type: "text", text: "Say " }, { type: "text", text: "something." }] }] });
  check("chat content as text parts", fingerprint(parts) === fingerprint(ch1), fingerprint(parts) + " vs " + fingerprint(ch1));
  const multi = await client.completions.create({ ...greedy, prompt: [greedy.prompt, "Another prompt"] });
  const other = await client.completions.create({ ...greedy, prompt: "Another prompt" });
  check("several prompts: one choice each, in order", multi.choices.length === 2 && multi.choices[0].index === 0 &&
        multi.choices[0].text === c1.choices[0].text && multi.choices[1].text === other.choices[0].text &&
        multi.usage.completion_tokens === c1.usage.completion_tokens + other.usage.completion_tokens, JSON.stringify(multi));
  const tk = await client.completions.create({ ...greedy, top_k: -1 });
  check("top_k -1 accepted (off)", fingerprint(tk) === fingerprint(c1));

  // invariance under load
  const aloneG = fingerprint(await client.completions.create(greedy));
  const aloneS = fingerprint(await client.completions.create(seeded));
  const aloneC = fingerprint(await client.chat.completions.create(chatReq));
  const aloneJ = fingerprint(await client.chat.completions.create(jsonReq));
  const aloneSc = fingerprint(await client.chat.completions.create(schemaReq));
  const others = [];
  for (let i = 0; i < 31; i++) {
    const n = 1 + ((i * 37) % 120), mt = 4 + ((i * 13) % 40);
    if (i % 3 === 0) {
      others.push((async () => { let t = ""; for await (const ch of await client.completions.create({ model, prompt: prompt(n), max_tokens: mt, temperature: (i % 2) * 0.8, seed: i, stream: true })) t += ch.choices[0]?.text ?? ""; return t; })());
    } else if (i % 3 === 1) {
      others.push(client.chat.completions.create({ model, messages: [{ role: "user", content: prompt(n) }], max_tokens: mt, temperature: 0.5, seed: i }));
    } else {
      others.push(client.completions.create({ model, prompt: prompt(n), max_tokens: mt, temperature: 0 }));
    }
  }
  await new Promise((r) => setTimeout(r, 30));
  const [g, s, c, jr, sr] = await Promise.all([client.completions.create(greedy), client.completions.create(seeded),
                                       client.chat.completions.create(chatReq), client.chat.completions.create(jsonReq),
                                       client.chat.completions.create(schemaReq)]);
  const res = await Promise.allSettled(others);
  check("31 concurrent requests all succeed", res.every((r) => r.status === "fulfilled"),
        JSON.stringify(res.filter((r) => r.status !== "fulfilled").map((r) => String(r.reason)).slice(0, 3)));
  check("invariance under load: greedy completion bitwise identical", fingerprint(g) === aloneG, fingerprint(g) + " vs " + aloneG);
  check("invariance under load: seeded sampling bitwise identical", fingerprint(s) === aloneS, fingerprint(s) + " vs " + aloneS);
  check("invariance under load: seeded chat bitwise identical", fingerprint(c) === aloneC, fingerprint(c) + " vs " + aloneC);
  check("invariance under load: json_object chat bitwise identical", fingerprint(jr) === aloneJ, fingerprint(jr) + " vs " + aloneJ);
  check("invariance under load: json_schema chat bitwise identical", fingerprint(sr) === aloneSc, fingerprint(sr) + " vs " + aloneSc);
  check("json_object: the reply is a JSON object or a prefix of one", jr.choices[0].message.content.trimStart().startsWith("{"), jr.choices[0].message.content);
  check("sampling differs from greedy", aloneS !== aloneG);
}
main().then(() => process.exit(fails ? 1 : 0), (e) => { console.log("FAIL client_test: " + (e.stack || e)); process.exit(1); });
