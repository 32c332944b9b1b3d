#!/usr/bin/env node
// loadgen.js — load generator for `isobatch serve`: N concurrent streaming clients over HTTP, each
// sending completion requests back to back for a fixed time; reports aggregate generated tokens/s,
// time to first token and inter-token latency percentiles. With --sessions N it instead creates N
// stateful sessions (each fed --prompt-tokens and one generated token) and reports the server's RSS
// growth per session (needs --pid, reads /proc/PID/status). With --conversations, each client owns a
// stateful session and loops append (--prompt-tokens of text) + generate (--max-tokens) for the time:
// the cost of the session store shows as the difference between servers with and without one.
//
//   node bench/loadgen.js --url http://127.0.0.1:8080 --model tiny --clients 8 --seconds 20 \
//        [--key KEY] [--prompt-tokens 64] [--max-tokens 64] [--json]
//   node bench/loadgen.js --url ... --sessions 64 --kv sink:4,window:1024 --pid PID
//   node bench/loadgen.js --url ... --clients 128 --seconds 30 --conversations [--kv POLICY]
const args = process.argv.slice(2);
function opt(name, def) { const i = args.indexOf("--" + name); return i >= 0 ? args[i + 1] : def; }
const url = opt("url", "http://127.0.0.1:8080"), key = opt("key", ""), model = opt("model", "default");
const clients = +opt("clients", 1), seconds = +opt("seconds", 20), promptTokens = +opt("prompt-tokens", 64);
const maxTokens = +opt("max-tokens", 64), asJson = args.includes("--json");
const headers = { "Content-Type": "application/json", ...(key ? { Authorization: "Bearer " + key } : {}) };
const words = "the quick brown fox jumps over the lazy dog and every answer stays the same".split(" ");
function promptText(seed) { let s = []; for (let i = 0; s.join(" ").length < promptTokens; i++) s.push(words[(i * 7 + seed) % words.length]); return s.join(" ").slice(0, promptTokens); }
function pct(a, p) { if (!a.length) return NaN; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; }
const now = () => Number(process.hrtime.bigint()) / 1e6; // ms

// One streaming completion; pushes TTFT and per-token gaps (ms); returns generated token count.
async function one(seed, ttft, itl) {
  const t0 = now();
  const r = await fetch(url + "/v1/completions", { method: "POST", headers, body: JSON.stringify({
    model, prompt: promptText(seed), max_tokens: maxTokens, temperature: 0.8, seed, stream: true, logprobs: 1 }) });
  if (r.status !== 200) { await r.text(); return -r.status; }
  const dec = new TextDecoder(); let buf = "", last = null, n = 0;
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith("data: {")) continue;
      const j = JSON.parse(ev.slice(6)); const lp = j.choices[0]?.logprobs; const k = lp ? lp.tokens.length : 0;
      if (!k) continue;
      const t = now();
      // the first chunk gives the TTFT (tokens beyond its first arrived with it: gap 0); later chunks
      // spread their gap over the tokens they carry
      if (last === null) { ttft.push(t - t0); for (let q = 1; q < k; q++) itl.push(0); }
      else for (let q = 0; q < k; q++) itl.push((t - last) / k);
      last = t; n += k;
    }
  }
  return n;
}

async function load() {
  const ttft = [], itl = []; let tokens = 0, reqs = 0, errors = 0, codes = {};
  const t0 = now(), tEnd = t0 + seconds * 1000;
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let k = 0; now() < tEnd; k++) {
      try { const n = await one(c * 1000 + k, ttft, itl); if (n < 0) { errors++; codes[-n] = (codes[-n] || 0) + 1; } else { tokens += n; reqs++; } }
      catch (e) { errors++; codes[String(e.cause?.code || e.message)] = 1; }
    }
  }));
  const wall = (now() - t0) / 1000;
  const res = { clients, seconds: +wall.toFixed(2), requests: reqs, errors, error_codes: codes, tokens,
    tokens_per_s: +(tokens / wall).toFixed(1), ttft_ms_p50: +pct(ttft, 50).toFixed(1), ttft_ms_p99: +pct(ttft, 99).toFixed(1),
    itl_ms_p50: +pct(itl, 50).toFixed(2), itl_ms_p99: +pct(itl, 99).toFixed(2), prompt_chars: promptTokens, max_tokens: maxTokens };
  if (asJson) console.log(JSON.stringify(res));
  else console.log(`clients ${clients}: ${reqs} requests (${errors} errors) in ${res.seconds} s, ${res.tokens_per_s} tok/s; ` +
                   `TTFT p50 ${res.ttft_ms_p50} ms p99 ${res.ttft_ms_p99} ms; ITL p50 ${res.itl_ms_p50} ms p99 ${res.itl_ms_p99} ms`);
}

// --conversations: each client a session of its own, append + generate in turn; per-turn latency.
async function conversations(kv) {
  const post = async (path, body) => {
    const r = await fetch(url + path, { method: "POST", headers, body: JSON.stringify(body) });
    const j = await r.json(); return [r.status, j];
  };
  const turnMs = []; let tokens = 0, turns = 0, errors = 0; const codes = {};
  const t0 = now(), tEnd = t0 + seconds * 1000;
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    try {
      const [st, s] = await post("/v1/sessions", kv ? { kv } : {});
      if (st !== 200) { errors++; codes[st] = (codes[st] || 0) + 1; return; }
      for (let k = 0; now() < tEnd; k++) {
        const t = now();
        const [a] = await post(`/v1/sessions/${s.id}/append`, { text: " " + promptText(c * 1000 + k) });
        const [g, j] = a === 200 ? await post(`/v1/sessions/${s.id}/generate`, { max_tokens: maxTokens, temperature: 0.8, seed: k }) : [a, null];
        if (g !== 200) { errors++; codes[g] = (codes[g] || 0) + 1; if (g === 400) break; continue; }
        turnMs.push(now() - t); turns++; tokens += j.usage ? j.usage.completion_tokens : 0;
      }
      await fetch(url + "/v1/sessions/" + s.id, { method: "DELETE", headers });
    } catch (e) { errors++; codes[String(e.cause?.code || e.message)] = 1; }
  }));
  const wall = (now() - t0) / 1000;
  const res = { clients, conversations: true, seconds: +wall.toFixed(2), turns, errors, error_codes: codes, tokens,
    tokens_per_s: +(tokens / wall).toFixed(1), turn_ms_p50: +pct(turnMs, 50).toFixed(1), turn_ms_p99: +pct(turnMs, 99).toFixed(1) };
  if (asJson) console.log(JSON.stringify(res));
  else console.log(`clients ${clients} (a session each): ${turns} turns (${errors} errors) in ${res.seconds} s, ` +
                   `${res.tokens_per_s} tok/s; turn p50 ${res.turn_ms_p50} ms p99 ${res.turn_ms_p99} ms`);
}

function rssKiB(pid) { const m = require("fs").readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/); return m ? +m[1] : NaN; }

async function sessions(n, kv, pid) {
  const post = async (path, body) => { const r = await fetch(url + path, { method: "POST", headers, body: JSON.stringify(body) }); const j = await r.json(); if (r.status !== 200) throw new Error(path + ": " + JSON.stringify(j)); return j; };
  const before = rssKiB(pid); let kvBytes = 0; const ids = [];
  for (let i = 0; i < n; i++) {
    const s = await post("/v1/sessions", kv ? { kv } : {});
    await post(`/v1/sessions/${s.id}/append`, { text: promptText(i) });
    await post(`/v1/sessions/${s.id}/generate`, { max_tokens: 1, temperature: 0 });
    kvBytes = s.kv_bytes; ids.push(s.id);
  }
  await new Promise((r) => setTimeout(r, 300));
  const after = rssKiB(pid);
  const res = { sessions: n, kv: kv || "server default", kv_bytes_per_session: kvBytes, rss_before_kib: before, rss_after_kib: after,
                rss_per_session_kib: +((after - before) / n).toFixed(1) };
  console.log(asJson ? JSON.stringify(res) : `${n} idle sessions (${res.kv}): RSS +${res.rss_per_session_kib} KiB each ` +
              `(${(kvBytes / 1024).toFixed(0)} KiB of KV allocated each, untouched pages not resident)`);
  for (const id of ids) await fetch(url + "/v1/sessions/" + id, { method: "DELETE", headers });
}

const nSessions = +opt("sessions", 0);
(nSessions ? sessions(nSessions, opt("kv", ""), +opt("pid", 0)) : args.includes("--conversations") ? conversations(opt("kv", "")) : load()).catch((e) => { console.error("loadgen: " + e.message); process.exit(1); });
