/*
 * gen.c — one generation (`gen`): its creation and reference counting, the scheduler's token
 * events (on_event), running it as a scheduler job and waiting for it, rendering its tokens to text
 * (stop strings, logprobs), the final JSON of a completion or chat completion (usage, verification
 * record) and the SSE stream of a streaming one.
 */
#include "server/server_impl.h"
#include "core/error.h"

#include <ctype.h>
#include <math.h>

/* Length of the longest prefix of s[0..n) that is valid, complete UTF-8. */
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char c = (unsigned char)s[i - 1];
    int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return (size_t)back + 1 >= (size_t)need ? n : i - 1;
}

void gen_unref(gen *g) {
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left) return;
    server *S = g->srv;
    pthread_mutex_lock(&S->mu);
    S->n_gens--;
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < g->n_stops; i++) free(g->stops[i]);
    ib_json_release(&g->json);
    json_decref(g->vcons);
    free(g->tok);
    free(g->dig);
    free(g->vin);
    free(g->vfl);
    ib_api_bias_free(&g->vbias);
    free(g->lp);
    free(g->top_ids);
    free(g->top_lp);
    free(g->tok_off);
    free(g->echo_lp);
    free(g->echo_top_ids);
    free(g->echo_top_lp);
    free(g->text);
    free(g->out);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

/* Scheduler callback: record a token, or the end (then free a request-scoped session, release its
 * memory, hand a stateful session its unfed tokens back). A token that cannot be recorded (out of
 * memory) sets g->oom and cancels the job: the generation ends with finish "error" (a 500 or an SSE
 * error event, never a shorter answer), and a stateful session is evicted unchanged in the store. */
void on_event(void *ctx, const ib_sched_event *ev) {
    gen *g = ctx;
    server *S = g->srv;
    if (ev->prompt) { /* an echoed prompt token's logprobs (its job's prompt_logprobs) */
        pthread_mutex_lock(&g->mu);
        const int i = ev->prompt_index;
        if (g->echo_lp && i > 0 && i < g->n_prompt) {
            g->echo_lp[i] = ev->logprob;
            for (int t = 0; t < ev->n_top && t < g->n_top; t++) {
                g->echo_top_ids[(size_t)i * g->n_top + t] = ev->top_ids[t];
                g->echo_top_lp[(size_t)i * g->n_top + t] = ev->top_logprob[t];
            }
        }
        pthread_mutex_unlock(&g->mu);
        return;
    }
    if (!ev->done) {
        double t = now_s();
        if (g->n == 0) /* only this thread appends tokens: g->n is stable here */
            ib_latency_first(&S->lat, t - g->t_arrive, ev->queue_seconds);
        else
            ib_latency_next(&S->lat, t - g->t_last);
        g->t_last = t;
        ib_latency_token(&S->lat, t);
        g->h = ev->logits_digest;   /* the job's running digest (digest_logits) */
        if (g->want_json) { /* advance the JSON reader past this token (its mask allowed it) */
            int stop = 0;
            for (int i = 0; i < g->n_stop_ids; i++) stop |= g->stop_ids[i] == ev->token;
            for (size_t k = S->jv.off[ev->token]; !stop && k < S->jv.off[ev->token + 1]; k++)
                if (ib_json_step(&g->json, (unsigned char)S->jv.bytes[k])) break;
        }
    }
    if (!ev->done && S->o.token_delay_ms > 0) nanosleep(&(struct timespec){S->o.token_delay_ms / 1000, (long)(S->o.token_delay_ms % 1000) * 1000000L}, NULL);
    if (ev->done) {
        if (g->own) {
            ib_session_free(g->own);
            g->own = NULL;
            pthread_mutex_lock(&S->mu);
            S->kv_used -= g->reserved;
            S->tu[g->tidx].kv -= g->reserved;
            pthread_cond_broadcast(&S->mem_cv);
            pthread_mutex_unlock(&S->mu);
        }
        if (g->inflight) {
            pthread_mutex_lock(&S->mu);
            S->tu[g->tidx].inflight--;
            g->inflight = 0;
            pthread_mutex_unlock(&S->mu);
        }
        if (g->ss && g->oom) {
            /* tokens are missing from g->tok: the session's KV holds tokens its history lacks, so it
             * cannot go on. It is evicted, nothing is stored (with a store, its next request loads it
             * as it was before this generation). */
            sess *ss = g->ss;
            pthread_mutex_lock(&g->mu);
            g->commit = 0;
            pthread_mutex_unlock(&g->mu);
            pthread_mutex_lock(&S->mu);
            ss->busy = 0;
            pthread_mutex_unlock(&S->mu);
            sess_evict(S, ss);
            sess_unref(S, ss);
            g->ss = NULL;
        } else if (g->ss) {
            sess *ss = g->ss;
            pthread_mutex_lock(&S->mu);
            /* the prompt was kept at pending[0, n_prompt) (appends are refused while busy): its unfed
             * tail goes back to the front; after generation the last sampled token is the pending one.
             * A rebuild's job fed n_replay stored tokens first: short of them, the KV is incomplete and
             * is forgotten (the session stays not resident, its pending tokens untouched). */
            int pf = ev->prompt_fed - g->n_replay;
            if (!ss->resident && pf < 0) {
                ib_session_reset(ss->s);
                ss->n_pending = g->n_prompt;
            } else {
                if (!ss->resident) {
                    ss->resident = 1;
                    ib_store_session_free(&ss->rec);
                }
                pthread_mutex_lock(&g->mu);
                hist_push(ss, g->tok, g->n, IB_STORE_TOK_SAMPLED, IB_STORE_TOK_NOTE_ON_FEED);
                pthread_mutex_unlock(&g->mu);
                int unfed = g->n_prompt - pf;
                ss->n_pending = 0;
                if (unfed > 0) {
                    memmove(ss->pending, ss->pending + pf, (size_t)unfed * sizeof(int32_t));
                    ss->n_pending = unfed;
                } else if (ev->generated > 0) {
                    pthread_mutex_lock(&g->mu);
                    ss->pending[ss->n_pending++] = g->tok[g->n - 1];
                    pthread_mutex_unlock(&g->mu);
                }
            }
            ss->last_used = now_s();
            if (!g->commit) { /* no store: the session is free now; with one, gen_commit frees it */
                ss->busy = 0;
                pthread_mutex_unlock(&S->mu);
                sess_unref(S, ss);
                g->ss = NULL;
            } else
                pthread_mutex_unlock(&S->mu);
        }
        pthread_mutex_lock(&g->mu);
        g->done = 1;
        snprintf(g->finish, sizeof g->finish, "%s", g->oom ? "error" : ev->finish);
        g->fed = ev->prompt_fed;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        gen_unref(g);
        return;
    }
    pthread_mutex_lock(&g->mu);
    if (g->n == g->cap && !g->oom) {
        int nc = g->cap ? 2 * g->cap : 64;
        int32_t *t = realloc(g->tok, (size_t)nc * sizeof *t);
        if (t) g->tok = t;
        double *l = realloc(g->lp, (size_t)nc * sizeof *l);
        if (l) g->lp = l;
        int *o = realloc(g->tok_off, ((size_t)nc + 1) * sizeof *o);
        if (o) g->tok_off = o;
        uint64_t *dg = realloc(g->dig, (size_t)nc * sizeof *dg);
        if (dg) g->dig = dg;
        int32_t *ti = g->top_ids;
        double *tl = g->top_lp;
        if (g->n_top) {
            if ((ti = realloc(g->top_ids, (size_t)nc * g->n_top * sizeof *ti))) g->top_ids = ti;
            if ((tl = realloc(g->top_lp, (size_t)nc * g->n_top * sizeof *tl))) g->top_lp = tl;
        }
        if (t && l && o && dg && (!g->n_top || (ti && tl))) g->cap = nc;
    }
    if (g->n < g->cap) {
        g->tok[g->n] = ev->token;
        g->dig[g->n] = g->h;
        g->lp[g->n] = ev->logprob;
        for (int i = 0; i < g->n_top; i++) { /* the scheduler gives exactly n_top (vocab >= 20) */
            g->top_ids[(size_t)g->n * g->n_top + i] = i < ev->n_top ? ev->top_ids[i] : -1;
            g->top_lp[(size_t)g->n * g->n_top + i] = i < ev->n_top ? ev->top_logprob[i] : 0.0;
        }
        g->n++;
    } else { /* out of memory: the token is lost, so the answer would be cut short; stop the job (again
              * on each later token: before run_gen knows the job's id, g->job is 0, which no job has) */
        if (!g->oom && S->log) {
            fprintf(S->log, "isobatch serve: %s: out of memory recording token %d: the generation fails\n", g->id, g->n);
            fflush(S->log);
        }
        g->oom = 1;
        ib_sched_cancel(S->sched, g->job);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Append n bytes to the growable buffer *b (*len used of *cap, kept NUL-terminated); -1 when out of
 * memory (the buffer unchanged). */
static int buf_append(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *t = realloc(*b, nc);
        if (!t) return -1;
        *b = t, *cap = nc;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

static int text_append(gen *g, const char *s, size_t n) { return buf_append(&g->text, &g->text_len, &g->text_cap, s, n); }

static int is_stop_id(const gen *g, int32_t t) {
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == t) return 1;
    return 0;
}

/* Render tokens [rendered, n) into text (stop ids add no text), look for stop strings; return how
 * many bytes of text may be shown now. Called with g->mu held. */
size_t render(gen *g) {
    const ib_model *m = g->srv->m;
    char buf[512];
    while (g->rendered < g->n && !g->stopped) {
        int32_t t = g->tok[g->rendered];
        g->tok_off[g->rendered] = (int)g->text_len;
        if (!is_stop_id(g, t)) {
            int w = ib_text_stream_push(m, &g->ts, t, buf, sizeof buf);
            if (w > 0) text_append(g, buf, (size_t)w);
        }
        g->rendered++;
        for (int i = 0; i < g->n_stops; i++) {
            size_t sl = strlen(g->stops[i]);
            size_t from = g->emitted > sl ? g->emitted - sl : 0;
            char *hit = g->text_len >= sl ? memmem(g->text + from, g->text_len - from, g->stops[i], sl) : NULL;
            if (hit) {
                g->text_len = (size_t)(hit - g->text);
                g->text[g->text_len] = 0;
                g->stopped = 1;
            }
        }
    }
    if (g->stopped) return g->text_len;
    if (g->done && g->rendered == g->n) {
        int w = ib_text_stream_flush(&g->ts, buf, sizeof buf);
        if (w > 0) text_append(g, buf, (size_t)w);
        return g->text_len;
    }
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++)
        if (strlen(g->stops[i]) - 1 > hold) hold = strlen(g->stops[i]) - 1;
    size_t safe = g->text_len > hold ? g->text_len - hold : 0;
    if (safe < g->emitted) safe = g->emitted;
    return g->emitted + utf8_complete(g->text + g->emitted, safe - g->emitted);
}

static const char *finish_reason(const gen *g) {
    if (g->stopped) return "stop";
    if (!strcmp(g->finish, "stop") || !strcmp(g->finish, "length")) return g->finish;
    return g->finish; /* "cancelled" or "error" */
}

/* Tokens covered by the shown text (a stop id is not shown; tokens after a stop string are not). */
static int tokens_shown(const gen *g) {
    int k = g->rendered;
    if (g->stopped) {
        while (k > 0 && (size_t)g->tok_off[k - 1] >= g->text_len) k--;
    }
    if (k > 0 && is_stop_id(g, g->tok[k - 1])) k--;
    return k;
}

/* An empty completions-format logprobs object (its top_logprobs null when no alternatives are asked). */
static json_t *completion_lp_new(int n_top) {
    json_t *o = json_object();
    json_object_set_new(o, "tokens", json_array());
    json_object_set_new(o, "token_logprobs", json_array());
    json_object_set_new(o, "top_logprobs", n_top ? json_array() : json_null());
    json_object_set_new(o, "text_offset", json_array());
    json_object_set_new(o, "token_ids", json_array());
    return o;
}

/* Append token id to the completions-format logprobs o: its text, logprob lp (NaN: null — an echoed
 * prompt's first token), its g->n_top alternatives top_ids/top_lp (ids < 0 skipped; with lp NaN the
 * entry is null) and its text offset. */
static void completion_lp_add(json_t *o, const gen *g, int32_t id, double lp, const int32_t *top_ids,
                              const double *top_lp, int off) {
    char buf[256];
    int w = ib_token_bytes(g->srv->m, id, buf, sizeof buf);
    json_array_append_new(json_object_get(o, "tokens"), ib_api_bytes_str(buf, w > 0 ? (size_t)w : 0));
    json_array_append_new(json_object_get(o, "token_logprobs"), lp == lp ? json_real(lp) : json_null());
    json_array_append_new(json_object_get(o, "text_offset"), json_integer(off));
    json_array_append_new(json_object_get(o, "token_ids"), json_integer(id));
    if (!g->n_top) return;
    if (lp != lp) {
        json_array_append_new(json_object_get(o, "top_logprobs"), json_null());
        return;
    }
    /* {token text: logprob}; tokens whose text repeats keep the first (the more likely) entry */
    json_t *m = json_object();
    for (int t = 0; t < g->n_top; t++) {
        if (top_ids[t] < 0) continue;
        int tw = ib_token_bytes(g->srv->m, top_ids[t], buf, sizeof buf);
        json_t *key = ib_api_bytes_str(buf, tw > 0 ? (size_t)tw : 0);
        const char *ks = key ? json_string_value(key) : NULL;
        if (ks && !json_object_get(m, ks)) json_object_set_new(m, ks, json_real(top_lp[t]));
        json_decref(key);
    }
    json_array_append_new(json_object_get(o, "top_logprobs"), m);
}

/* completion_lp_add for generated token i, its text offset moved by `shift` (an echo's text before it). */
static void generated_lp_add(json_t *o, const gen *g, int i, int shift) {
    completion_lp_add(o, g, g->tok[i], g->lp[i], g->n_top ? g->top_ids + (size_t)i * g->n_top : NULL,
                      g->n_top ? g->top_lp + (size_t)i * g->n_top : NULL, g->tok_off[i] + shift);
}

/* Logprobs of tokens [a, b) in the completions format or the chat format. */
static json_t *logprobs_json(const gen *g, int a, int b) {
    char buf[256];
    if (g->chat) {
        json_t *content = json_array();
        for (int i = a; i < b; i++) {
            int w = ib_token_bytes(g->srv->m, g->tok[i], buf, sizeof buf);
            if (w < 0) w = 0;
            json_t *bytes = json_array();
            for (int k = 0; k < w; k++) json_array_append_new(bytes, json_integer((unsigned char)buf[k]));
            json_t *e = json_object();
            json_object_set_new(e, "token", ib_api_bytes_str(buf, (size_t)w));
            json_object_set_new(e, "logprob", json_real(g->lp[i]));
            json_object_set_new(e, "bytes", bytes);
            json_t *top = json_array();
            for (int t = 0; t < g->n_top; t++) {
                int32_t id = g->top_ids[(size_t)i * g->n_top + t];
                if (id < 0) continue;
                int tw = ib_token_bytes(g->srv->m, id, buf, sizeof buf);
                if (tw < 0) tw = 0;
                json_t *tb = json_array();
                for (int q = 0; q < tw; q++) json_array_append_new(tb, json_integer((unsigned char)buf[q]));
                json_t *te = json_object();
                json_object_set_new(te, "token", ib_api_bytes_str(buf, (size_t)tw));
                json_object_set_new(te, "logprob", json_real(g->top_lp[(size_t)i * g->n_top + t]));
                json_object_set_new(te, "bytes", tb);
                json_object_set_new(te, "token_id", json_integer(id));
                json_array_append_new(top, te);
            }
            json_object_set_new(e, "top_logprobs", top);
            json_object_set_new(e, "token_id", json_integer(g->tok[i]));
            json_array_append_new(content, e);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", content);
        return o;
    }
    json_t *o = completion_lp_new(g->n_top);
    for (int i = a; i < b; i++) generated_lp_add(o, g, i, (int)g->echo_len);
    return o;
}

/* The prompt's tokens of an echoing generation rendered (a text stream of their own) into *t (*len bytes
 * of *cap, growable), each token's offset in off[n_prompt]; -1 when out of memory. */
static int echo_render(const gen *g, char **t, size_t *len, size_t *cap, int *off) {
    const ib_model *m = g->srv->m;
    ib_text_stream ts = {0};
    char piece[512];
    for (int i = 0; i < g->n_prompt; i++) {
        off[i] = (int)*len;
        const int w = ib_text_stream_push(m, &ts, g->vin[i], piece, sizeof piece);
        if (w > 0 && buf_append(t, len, cap, piece, (size_t)w)) return -1;
    }
    const int w = ib_text_stream_flush(&ts, piece, sizeof piece);
    return w > 0 ? buf_append(t, len, cap, piece, (size_t)w) : 0;
}

/* The completions-format logprobs of an echoed prompt's tokens (the first one's null; the others from
 * the PROMPT events), at offsets off, into o. */
static void echo_lp_add(json_t *o, const gen *g, const int *off) {
    for (int i = 0; i < g->n_prompt; i++)
        completion_lp_add(o, g, g->vin[i], g->echo_lp[i], g->n_top ? g->echo_top_ids + (size_t)i * g->n_top : NULL,
                          g->n_top ? g->echo_top_lp + (size_t)i * g->n_top : NULL, off[i]);
}

/* An echoing completion (g->echo): its "text" — the prompt rendered, then the completion's shown text —
 * into *text, and returns its logprobs (g->want_lp, else NULL): the prompt's tokens, then the first k
 * generated ones, offsets into that text. Out of memory: *text and the result NULL. */
static json_t *echo_completion(const gen *g, int k, json_t **text) {
    char *t = NULL;
    size_t len = 0, cap = 0;
    int *off = malloc(((size_t)g->n_prompt + 1) * sizeof *off);
    int bad = !off || echo_render(g, &t, &len, &cap, off);
    const size_t echo_len = len;
    bad = bad || buf_append(&t, &len, &cap, g->text ? g->text : "", g->text_len);
    *text = bad ? NULL : ib_api_bytes_str(t, len);
    json_t *o = NULL;
    if (!bad && g->want_lp) {
        o = completion_lp_new(g->n_top);
        echo_lp_add(o, g, off);
        for (int i = 0; i < k; i++) generated_lp_add(o, g, i, (int)echo_len);
    }
    free(off);
    free(t);
    return o;
}

static json_t *usage_json(const gen *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(g->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->n));
    json_object_set_new(u, "total_tokens", json_integer(g->n_prompt + g->n));
    return u;
}

json_t *envelope(const gen *g, const char *object) {
    if (g->head) g = g->head;   /* a streamed choice: the response's id, created and seed */
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(g->id));
    json_object_set_new(j, "object", json_string(object));
    json_object_set_new(j, "created", json_integer(g->created));
    json_object_set_new(j, "model", json_string(g->srv->model_id));
    json_object_set_new(j, "seed", json_integer((json_int_t)g->seed));
    char fp[IB_MODEL_ID_LEN + 32];
    ib_verify_fingerprint(g->srv->ident, fp, sizeof fp);
    json_object_set_new(j, "system_fingerprint", json_string(fp));
    return j;
}

/* The verification record of a finished generation (verify.h), or null when it drew no token or its
 * prompt could not be recorded. g->mu held (or the generation done). */
static json_t *verification_json(const gen *g) {
    server *S = g->srv;
    if (g->n < 1 || g->n_vprompt < 1) return json_null();
    return ib_verify_json(S->ident, ib_engine_act(S->e), g->vkvd, g->vkv, g->vcap, g->vchunk, g->vin, g->n_vhist, g->vfl, g->draws0,
                          g->vin + g->n_vhist, g->n_vprompt, &g->sp, &g->vbias, g->vcons, g->stop_ids,
                          g->n_stop_ids, g->tok, g->dig, g->n);
}

/* A finished chat reply's tool calls (tool_calls.c), or NULL: when it stopped, a forced call's
 * arguments or a "required" reply's calls; or the calls read from the text ("auto"); *content_len:
 * the text that stays content. */
static json_t *reply_calls(const gen *g, size_t *content_len) {
    *content_len = g->text_len;
    if (!g->chat) return NULL;
    json_t *calls = NULL;
    if ((g->tool_mode == IB_TOOLS_FORCED || g->tool_mode == IB_TOOLS_REQUIRED) && !strcmp(finish_reason(g), "stop")) {
        calls = ib_api_tool_calls_constrained(g->tool_form, g->tool_mode == IB_TOOLS_FORCED ? g->tool_name : NULL, g->text,
                                              g->text_len, g->id, g->tool_parallel);
        if (calls) *content_len = 0;
    } else if (g->tool_mode == IB_TOOLS_AUTO) {
        size_t cl = 0;
        calls = ib_api_reply_tool_calls(g->tool_form, g->text, g->text_len, g->id, g->tool_parallel ? 0 : 1, &cl);
        if (calls) *content_len = cl;
    }
    return calls;
}

/* Tools in a stream, before the end: how far the content may go out now — nowhere past what is out
 * for a forced or "required" call (its text is the call); for "auto", up to the first call opening
 * ("<tool_call>", Gemma 4's "<|tool_call>"), or up to a tail that may still become one, less trailing
 * whitespace (the content of a reply with calls ends without it). The cut falls on ASCII bytes, so on
 * a character boundary. */
static size_t tool_stream_end(const gen *g, size_t show) {
    const char *open = ib_api_tool_call_marker(g->tool_form);
    const size_t ol = strlen(open);
    if (g->tool_mode == IB_TOOLS_FORCED || g->tool_mode == IB_TOOLS_REQUIRED || show <= g->emitted) return g->emitted;   /* (no text yet: NULL) */
    size_t lim = show;
    /* nothing out so far can hold an opening (the content stops before one), so look from there only */
    const char *hit = memmem(g->text + g->emitted, show - g->emitted, open, ol);
    if (hit) lim = (size_t)(hit - g->text);
    else
        for (size_t k = ol - 1; k > 0; k--)
            if (show >= k && !memcmp(g->text + show - k, open, k)) {
                lim = show - k;
                break;
            }
    while (lim > g->emitted && isspace((unsigned char)g->text[lim - 1])) lim--;   /* as ib_tool_content_len trims */
    return lim > g->emitted ? lim : g->emitted;
}

/* Of the first k tokens, how many have their text wholly before byte end. */
static int tokens_within(const gen *g, size_t end, int k) {
    int j = 0;
    while (j < k && (j + 1 < g->rendered ? (size_t)g->tok_off[j + 1] : g->text_len) <= end) j++;
    return j;
}

/* The non-streaming body of a finished generation. */
json_t *final_json(gen *g) {
    size_t show = render(g);
    (void)show;
    int k = tokens_shown(g);
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    json_t *j, *calls = NULL;
    if (g->chat) {
        j = envelope(g, "chat.completion");
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        /* tools: the calls read from the text (tool_calls.c); the text before them stays the content */
        size_t cl;
        calls = reply_calls(g, &cl);
        json_object_set_new(msg, "content", calls && !cl ? json_null() : ib_api_bytes_str(g->text, cl));
        if (calls) json_object_set_new(msg, "tool_calls", calls);
        json_object_set_new(ch, "message", msg);
    } else {
        j = envelope(g, g->session_gen ? "session.generation" : "text_completion");
        if (g->echo) {
            json_t *text = NULL, *lp = echo_completion(g, k, &text);
            json_object_set_new(ch, "text", text ? text : json_null());
            json_object_set_new(ch, "logprobs", lp ? lp : json_null());
        } else {
            json_object_set_new(ch, "text", ib_api_bytes_str(g->text, g->text_len));
        }
    }
    if (!g->echo) json_object_set_new(ch, "logprobs", g->want_lp ? logprobs_json(g, 0, k) : json_null());
    json_object_set_new(ch, "finish_reason", json_string(calls ? "tool_calls" : finish_reason(g)));
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(j, "choices", choices);
    json_object_set_new(j, "usage", usage_json(g));
    json_object_set_new(j, "verification", verification_json(g));
    return j;
}

static int out_append(gen *g, const char *s, size_t n) { return buf_append(&g->out, &g->out_len, &g->out_cap, s, n); }

static void out_event(gen *g, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    out_append(g, "data: ", 6);
    out_append(g, s, strlen(s));
    out_append(g, "\n\n", 2);
    free(s);
}

/* One SSE chunk with text delta [a, b) of the text, logprobs of tokens [ta, tb), a finish reason, and
 * (chat; calls != NULL, taken) the reply's tool calls, each with its "index". */
static void out_chunk(gen *g, size_t a, size_t b, int ta, int tb, const char *finish, json_t *calls) {
    json_t *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(g->choice));
    if (g->chat) {
        json_t *delta = json_object();
        if (!g->sent_role) {
            json_object_set_new(delta, "role", json_string("assistant"));
            g->sent_role = 1;
        }
        if (b > a) json_object_set_new(delta, "content", ib_api_bytes_str(g->text + a, b - a));
        if (calls) {
            size_t i;
            json_t *c;
            json_array_foreach(calls, i, c) json_object_set_new(c, "index", json_integer((json_int_t)i));
            json_object_set_new(delta, "tool_calls", calls);
            calls = NULL;
        }
        json_object_set_new(ch, "delta", delta);
    } else
        json_object_set_new(ch, "text", ib_api_bytes_str(g->text + a, b - a));
    json_object_set_new(ch, "logprobs", g->want_lp && tb > ta ? logprobs_json(g, ta, tb) : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_decref(calls);   /* a completion chunk has none */
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(j, "choices", choices);
    if (g->include_usage) json_object_set_new(j, "usage", json_null());
    if (finish) json_object_set_new(j, "verification", verification_json(g));
    out_event(g, j);
}

/* A streamed echoing completion's first chunk: the prompt's text and (want_lp) its tokens' logprobs;
 * sets g->echo_len, which the later chunks' text offsets follow. Out of memory: an empty text. */
static void out_echo_chunk(gen *g) {
    char *t = NULL;
    size_t len = 0, cap = 0;
    int *off = malloc(((size_t)g->n_prompt + 1) * sizeof *off);
    const int bad = !off || echo_render(g, &t, &len, &cap, off);
    json_t *j = envelope(g, "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(g->choice));
    json_object_set_new(ch, "text", ib_api_bytes_str(bad ? "" : t, bad ? 0 : len));
    json_t *lp = json_null();
    if (!bad && g->want_lp) {
        lp = completion_lp_new(g->n_top);
        echo_lp_add(lp, g, off);
    }
    json_object_set_new(ch, "logprobs", lp);
    json_object_set_new(ch, "finish_reason", json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(j, "choices", choices);
    if (g->include_usage) json_object_set_new(j, "usage", json_null());
    out_event(g, j);
    g->echo_len = bad ? 0 : len;
    g->echo_sent = 1;
    free(off);
    free(t);
}

/* One round of g's stream (g->mu held, its out buffer empty): what the job produced since the last
 * round rendered and appended to g->out as chunks; once the generation is over, its last chunk (the
 * finish reason, or an error event) and, when `alone` (the response's only generation), the usage
 * chunk and [DONE]; then g->sent_done. Returns whether g is over (sent_done). */
static int sse_round(gen *g, int alone) {
    server *S = g->srv;
    size_t show = render(g);
    int finished = g->stopped || (g->done && g->rendered == g->n);
    if (finished && g->stored_gen && !g->done) { /* a stop string: end the job, store it, then finish */
        if (!g->stop_cancelled) ib_sched_cancel(S->sched, g->job);
        g->stop_cancelled = 1;
        finished = 0;
    }
    if (finished && g->commit) { /* the tokens are durable before the final chunk goes out */
        pthread_mutex_unlock(&g->mu);
        gen_commit(g);
        pthread_mutex_lock(&g->mu);
    }
    /* echo: the prompt's chunk first, once its PROMPT events are in (all come before the first token) */
    if (g->echo && !g->echo_sent && !g->store_failed && (g->n > 0 || (g->done && strcmp(finish_reason(g), "error"))))
        out_echo_chunk(g);
    int k = tokens_shown(g);
    json_t *calls = NULL;   /* tools: the reply's calls, read once it is finished */
    if (g->chat && g->tool_mode != IB_TOOLS_OFF) {
        if (!finished) {
            show = tool_stream_end(g, show);
            k = tokens_within(g, show, k);
            if (k < g->lp_emitted) k = g->lp_emitted;
        } else if (!g->store_failed && strcmp(finish_reason(g), "error")) {
            size_t cl;
            if ((calls = reply_calls(g, &cl))) show = cl > g->emitted ? cl : g->emitted;
        }
    }
    if (show > g->emitted || (k > g->lp_emitted && g->want_lp) || (g->chat && !g->sent_role) || calls) {
        out_chunk(g, g->emitted, show, g->lp_emitted, k, NULL, calls);
        g->emitted = show;
        g->lp_emitted = k;
    }
    if (!finished) return 0;
    if (g->stopped && !g->done) ib_sched_cancel(S->sched, g->job);
    if (g->store_failed) {
        static const char se[] = "data: {\"error\":{\"message\":\"the session's tokens could not be stored; "
                                  "the session is back at its last stored state\",\"type\":\"server_error\","
                                  "\"code\":\"store_error\"}}\n\n";
        out_append(g, se, sizeof se - 1);
    } else if (!strcmp(finish_reason(g), "error")) {
        static const char ge[] = "data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}\n\n";
        static const char oe[] = "data: {\"error\":{\"message\":\"generation failed: out of memory recording its "
                                  "tokens\",\"type\":\"server_error\"}}\n\n";
        if (g->oom) out_append(g, oe, sizeof oe - 1);
        else out_append(g, ge, sizeof ge - 1);
    } else
        out_chunk(g, show, show, k, k, calls ? "tool_calls" : finish_reason(g), NULL);
    if (alone) {
        if (g->include_usage) {
            json_t *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(j, "choices", json_array());
            json_object_set_new(j, "usage", usage_json(g));
            out_event(g, j);
        }
        out_append(g, "data: [DONE]\n\n", 14);
    }
    g->sent_done = 1;
    return 1;
}

/* Up to max of g's pending stream bytes into buf (g->mu held); how many. */
static size_t out_take(gen *g, char *buf, size_t max) {
    size_t n = g->out_len - g->out_pos;
    if (n > max) n = max;
    memcpy(buf, g->out + g->out_pos, n);
    g->out_pos += n;
    return n;
}

/* MHD content reader for SSE: blocks until there is something to send. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
    server *S = g->srv;
    pthread_mutex_lock(&g->mu);
    double t_end = now_s() + S->o.timeout_s;
    while (g->out_pos == g->out_len) {
        g->out_pos = g->out_len = 0;
        if (g->sent_done) {
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        sse_round(g, 1);
        if (g->out_len) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (now_s() > t_end) { /* the request ran too long: stop it */
            ib_sched_cancel(S->sched, g->job);
            t_end = now_s() + 3600;
        }
    }
    size_t n = out_take(g, buf, max);
    pthread_mutex_unlock(&g->mu);
    return (ssize_t)n;
}

/* A streamed response of several generations (stream_choices). */
typedef struct sse_set {
    server *S;
    gen **gs;
    int n, per_prompt;   /* generations; choices a prompt (usage counts a prompt once) */
    int next;            /* the generation to look at first (round robin) */
    char *tail;          /* the usage chunk and [DONE], once every generation is over */
    size_t tail_len, tail_pos;
    double t_end;        /* the time limit: past it every generation is cancelled */
} sse_set;

/* MHD content reader of a streamed set: each generation's chunks as they come (round robin, a
 * generation's bytes never split by another's: a chunk is whole before the next one starts), then the
 * tail; blocks until there is something to send. */
static ssize_t sse_set_read(void *cls, uint64_t pos, char *buf, size_t max) {
    sse_set *t = cls;
    for (;;) {
        if (t->tail) {
            if (t->tail_pos == t->tail_len) return MHD_CONTENT_READER_END_OF_STREAM;
            size_t n = t->tail_len - t->tail_pos < max ? t->tail_len - t->tail_pos : max;
            memcpy(buf, t->tail + t->tail_pos, n);
            t->tail_pos += n;
            return (ssize_t)n;
        }
        int over = 0;
        gen *wait_on = NULL;
        for (int r = 0; r < t->n; r++) {
            gen *g = t->gs[(t->next + r) % t->n];
            pthread_mutex_lock(&g->mu);
            if (g->out_pos == g->out_len && !g->sent_done) {
                g->out_pos = g->out_len = 0;
                sse_round(g, 0);
            }
            if (g->out_pos < g->out_len) {
                size_t n = out_take(g, buf, max);
                if (g->out_pos == g->out_len) t->next = (t->next + r + 1) % t->n;   /* its chunks sent: the next one's turn */
                else t->next = (t->next + r) % t->n;
                pthread_mutex_unlock(&g->mu);
                return (ssize_t)n;
            }
            over += g->sent_done;
            if (!g->sent_done && !wait_on) wait_on = g;
            pthread_mutex_unlock(&g->mu);
        }
        if (over == t->n) {   /* every generation is over: the usage chunk and [DONE] */
            json_t *u = NULL;
            gen *h = t->gs[0];
            if (h->include_usage) {
                long long pt = 0, ct = 0;
                for (int k = 0; k < t->n; k++) {
                    pthread_mutex_lock(&t->gs[k]->mu);
                    pt += k % t->per_prompt == 0 ? t->gs[k]->n_prompt : 0;
                    ct += t->gs[k]->n;
                    pthread_mutex_unlock(&t->gs[k]->mu);
                }
                u = envelope(h, h->chat ? "chat.completion.chunk" : "text_completion");
                json_object_set_new(u, "choices", json_array());
                json_t *us = json_object();
                json_object_set_new(us, "prompt_tokens", json_integer(pt));
                json_object_set_new(us, "completion_tokens", json_integer(ct));
                json_object_set_new(us, "total_tokens", json_integer(pt + ct));
                json_object_set_new(u, "usage", us);
            }
            char *us = u ? json_dumps(u, JSON_COMPACT) : NULL;
            json_decref(u);
            size_t ul = us ? strlen(us) : 0;
            t->tail = malloc(ul + 32);
            if (!t->tail) {
                free(us);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            t->tail_len = us ? (size_t)sprintf(t->tail, "data: %s\n\n", us) : 0;
            t->tail_len += (size_t)sprintf(t->tail + t->tail_len, "data: [DONE]\n\n");
            free(us);
            continue;
        }
        /* nothing to send: wait for the first unfinished one (the choices step together) */
        pthread_mutex_lock(&wait_on->mu);
        if (!wait_on->done || wait_on->rendered < wait_on->n) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long long ns = ts.tv_nsec + 20000000LL;   /* 20 ms: how late another choice's token may go out */
            ts.tv_sec += ns / 1000000000LL;
            ts.tv_nsec = ns % 1000000000LL;
            pthread_cond_timedwait(&wait_on->cv, &wait_on->mu, &ts);
        }
        pthread_mutex_unlock(&wait_on->mu);
        if (now_s() > t->t_end) { /* the request ran too long: stop them */
            for (int k = 0; k < t->n; k++) ib_sched_cancel(t->S->sched, t->gs[k]->job);
            t->t_end = now_s() + 3600;
        }
    }
}

/* MHD: a streamed set's response is gone (finished or the client went away): stop what still runs. */
static void sse_set_free(void *cls) {
    sse_set *t = cls;
    for (int k = 0; k < t->n; k++) {
        gen *g = t->gs[k];
        pthread_mutex_lock(&g->mu);
        int done = g->done;
        pthread_mutex_unlock(&g->mu);
        if (!done) ib_sched_cancel(t->S->sched, g->job);
    }
    for (int k = t->n - 1; k >= 0; k--) gen_unref(t->gs[k]);   /* the first (every chunk's head) last */
    free(t->gs);
    free(t->tail);
    free(t);
}

/* An SSE response over reader/cls (freed by fr), with the stream's headers, queued on c. */
static enum MHD_Result sse_queue(server *S, struct MHD_Connection *c, MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback fr) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, cls, fr);
    if (!r) {
        fr(cls);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    ib_http_decorate(r, 200);
    pthread_mutex_lock(&S->mu);
    S->http_by_class[2]++;
    pthread_mutex_unlock(&S->mu);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result stream_choices(server *S, struct MHD_Connection *c, gen **gs, int n, int n_per_prompt) {
    sse_set *t = calloc(1, sizeof *t);
    gen **own = malloc((size_t)n * sizeof *own);
    if (!t || !own) {
        free(t);
        free(own);
        for (int k = 0; k < n; k++) {
            ib_sched_cancel(S->sched, gs[k]->job);
            gen_unref(gs[k]);
        }
        return MHD_NO;
    }
    memcpy(own, gs, (size_t)n * sizeof *own);
    for (int k = 0; k < n; k++) {
        pthread_mutex_lock(&own[k]->mu);
        own[k]->choice = k;
        own[k]->head = k > 0 ? own[0] : NULL;
        pthread_mutex_unlock(&own[k]->mu);
    }
    *t = (sse_set){.S = S, .gs = own, .n = n, .per_prompt = n_per_prompt, .t_end = now_s() + S->o.timeout_s};
    return sse_queue(S, c, sse_set_read, t, sse_set_free);
}

/* MHD: the stream's response is gone (finished or the client went away): stop the job. */
static void sse_free(void *cls) {
    gen *g = cls;
    pthread_mutex_lock(&g->mu);
    int done = g->done;
    pthread_mutex_unlock(&g->mu);
    if (!done) ib_sched_cancel(g->srv->sched, g->job);
    if (g->stored_gen) { /* the client left: the session's tokens are stored all the same */
        pthread_mutex_lock(&g->mu);
        while (!g->done) pthread_cond_wait(&g->cv, &g->mu);
        pthread_mutex_unlock(&g->mu);
        gen_commit(g);
    }
    gen_unref(g);
}

/* Whether the client of connection c has closed its end (it gave up on a request it is waiting for).
 * Looks at the socket without reading from it: a half-close or reset counts as gone. */
int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ib_sched_job.constrain of a constrained generation (json_constraint.c; set up by constraint.c). */
static int json_constrain(void *ctx, float *logits, int vocab) {
    gen *g = ctx;
    return ib_json_mask(&g->json, &g->srv->jv, logits, vocab, g->stop_ids, g->n_stop_ids);
}

/* The scheduler job of generation g on session s (prompt ids[n_ids], p's sampling, limits and bias:
 * they must outlive the submission); sets s's sampling and g's KV facts for its verification record. */
ib_sched_job gen_job(gen *g, ib_session *s, const int32_t *ids, int n_ids, const gen_params *p) {
    g->vcap = s->capacity;
    g->vchunk = s->kv_chunk;
    ib_session_set_sampling(s, &p->sp);
    return (ib_sched_job){.session = s, .prompt = ids, .n_prompt = n_ids, .max_new_tokens = p->max_tokens,
                          .n_replay = g->n_replay, .stop_ids = g->stop_ids, .n_stop = g->n_stop_ids,
                          .want_logprobs = p->want_lp, .top_logprobs = g->n_top, .group = g->tidx,
                          .on_event = on_event, .ctx = g,
                          .logit_bias_ids = p->bias.ids, .logit_bias = p->bias.vals, .n_logit_bias = p->bias.n,
                          .constrain = g->want_json ? json_constrain : NULL, .constrain_ctx = g, .digest_logits = 1,
                          .prompt_logprobs = g->echo && g->want_lp};
}

int gen_submit_n(server *S, struct MHD_Connection *c, gen **gs, const ib_sched_job *jobs, int n, enum MHD_Result *ret) {
    for (int k = 0; k < n; k++) gs[k]->refs = 2; /* the connection, the scheduler */
    ib_error err;
    uint64_t one, *ids = n == 1 ? &one : calloc((size_t)n, sizeof *ids);
    ib_status rc = ids ? ib_sched_submit_n(S->sched, jobs, n, ids, &err) : ib_fail(&err, IB_ERR_NOMEM, "out of memory");
    if (rc) {
        /* nothing was started: undo as the DONE event would have */
        for (int k = 0; k < n; k++) {
            ib_sched_event ev = {.done = 1, .finish = "error", .prompt_fed = 0, .generated = 0};
            on_event(gs[k], &ev);
            gen_commit(gs[k]);
            gen_unref(gs[k]);
        }
        if (ids != &one) free(ids);
        if (err.code == IB_ERR_STATE)
            *ret = send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                              "the server is at capacity (%d running, queue full); retry later", S->o.max_batch);
        else if (err.code == IB_ERR_CONTEXT)
            *ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens", "%s", err.msg);
        else
            *ret = send_error(S, c, 500, "server_error", NULL, NULL, "%s", err.msg);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        pthread_mutex_lock(&gs[k]->mu);
        gs[k]->job = ids[k];
        pthread_mutex_unlock(&gs[k]->mu);
    }
    if (ids != &one) free(ids);
    /* the idle timeout guards reading the request; while the generation runs (queued, or streaming
     * with gaps) its own time limit applies, so the connection must not be dropped as idle first */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)S->o.timeout_s + 30u);
    return 0;
}

int gen_submit(server *S, struct MHD_Connection *c, gen *g, ib_session *s, const int32_t *ids, int n_ids, gen_params *p,
               enum MHD_Result *ret) {
    ib_sched_job jb = gen_job(g, s, ids, n_ids, p);
    return gen_submit_n(S, c, &g, &jb, 1, ret);
}

enum MHD_Result run_gen(server *S, struct MHD_Connection *c, gen *g, ib_session *s, const int32_t *ids,
                        int n_ids, gen_params *p) {
    enum MHD_Result sent;
    if (gen_submit(S, c, g, s, ids, n_ids, p, &sent)) return sent;
    if (g->stream) return sse_queue(S, c, sse_read, g, sse_free);   /* (sse_free cancels and drops g) */
    /* wait for the end, a stop string, the time limit, or the client going away */
    pthread_mutex_lock(&g->mu);
    double t_end = now_s() + S->o.timeout_s;
    int cancelled = 0, gone = 0;
    for (;;) {
        render(g);
        if (g->done) break;
        if (!gone && client_gone(c)) gone = 1;
        if (g->stopped || gone || now_s() > t_end) {
            if (!cancelled) ib_sched_cancel(S->sched, g->job);
            cancelled = 1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + 200000000LL; /* 0.2 s: how soon a client's leaving is noticed */
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    if (g->commit) { /* the tokens are durable before the response is sent */
        pthread_mutex_unlock(&g->mu);
        gen_commit(g);
        pthread_mutex_lock(&g->mu);
    }
    enum MHD_Result ret;
    if (gone && !strcmp(g->finish, "cancelled")) {
        pthread_mutex_unlock(&g->mu);
        ret = MHD_NO; /* nobody to answer: close the connection */
    } else if (g->store_failed) {
        pthread_mutex_unlock(&g->mu);
        ret = send_error(S, c, 503, "server_error", "store_error", NULL,
                         "the session's tokens could not be stored; the session is back at its last stored state");
    } else if (!strcmp(g->finish, "error")) {
        int oom = g->oom;
        pthread_mutex_unlock(&g->mu);
        ret = send_error(S, c, 500, "server_error", NULL, NULL, "generation failed%s",
                         oom ? ": out of memory recording its tokens" : "");
    } else if (!strcmp(g->finish, "cancelled") && !g->stopped) {
        pthread_mutex_unlock(&g->mu);
        if (S->draining)
            ret = send_error(S, c, 503, "server_error", "server_shutting_down", NULL,
                             "the server is shutting down and its drain time ran out; retry on another server");
        else
            ret = send_error(S, c, 504, "server_error", "timeout", NULL, "generation cancelled (time limit)");
    } else {
        json_t *j = final_json(g);
        pthread_mutex_unlock(&g->mu);
        ret = send_json(S, c, 200, j, 0);
    }
    gen_unref(g);
    return ret;
}

/* Record a request-scoped generation's prompt for its verification record (no history, no draws; an
 * allocation failure leaves the record's prompt empty: verification null) and, echoing, for the reply
 * (-1 when that memory is not there). */
int gen_set_prompt(gen *g, const int32_t *ids, int n) {
    if ((g->vin = malloc((size_t)n * sizeof *ids))) {
        memcpy(g->vin, ids, (size_t)n * sizeof *ids);
        g->n_vprompt = n;
    }
    if (!g->echo) return 0;
    /* echo: the prompt (that copy: a request-scoped generation has no history before it), and room for
     * its tokens' logprobs (NaN and id -1 until their events) */
    if (!g->vin) return -1;
    if (!g->want_lp) return 0;
    const size_t nt = (size_t)n * (size_t)(g->n_top > 0 ? g->n_top : 1);
    g->echo_lp = malloc((size_t)n * sizeof *g->echo_lp);
    g->echo_top_ids = malloc(nt * sizeof *g->echo_top_ids);
    g->echo_top_lp = calloc(nt, sizeof *g->echo_top_lp);
    if (!g->echo_lp || !g->echo_top_ids || !g->echo_top_lp) return -1;
    for (int i = 0; i < n; i++) g->echo_lp[i] = NAN;
    for (size_t i = 0; i < nt; i++) g->echo_top_ids[i] = -1;
    return 0;
}

gen *gen_new(server *S, int chat, gen_params *p) {
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->srv = S;
    pthread_mutex_lock(&S->mu);
    S->n_gens++;
    pthread_mutex_unlock(&S->mu);
    g->chat = chat;
    g->stream = p->stream;
    g->include_usage = p->include_usage;
    g->want_lp = p->want_lp;
    g->n_top = p->want_lp ? p->top_lp : 0;
    g->echo = p->echo;
    for (int i = 0; i < p->n_stops; i++) g->stops[i] = p->stops[i];
    g->n_stops = p->n_stops;
    p->n_stops = 0;
    g->created = (long)time(NULL);
    g->seed = p->sp.seed;
    g->sp = p->sp;
    g->h = IB_DIGEST_INIT;
    g->vkvd = S->o.kv_dtype;
    snprintf(g->vkv, sizeof g->vkv, "full");
    if (p->bias.n > 0) { /* kept for the verification record */
        g->vbias.ids = malloc((size_t)p->bias.n * sizeof *g->vbias.ids);
        g->vbias.vals = malloc((size_t)p->bias.n * sizeof *g->vbias.vals);
        if (g->vbias.ids && g->vbias.vals) {
            memcpy(g->vbias.ids, p->bias.ids, (size_t)p->bias.n * sizeof *g->vbias.ids);
            memcpy(g->vbias.vals, p->bias.vals, (size_t)p->bias.n * sizeof *g->vbias.vals);
            g->vbias.n = p->bias.n;
        }
    }
    g->t_arrive = g->t_last = now_s();
    char hex[33];
    if (random_hex(S, hex, 12)) snprintf(hex, sizeof hex, "0");
    snprintf(g->id, sizeof g->id, "%s-%s", chat ? "chatcmpl" : "cmpl", hex);
    return g;
}
