/*
 * fuzz_requests.c — libFuzzer target: request bodies of the chat/completions, completions and
 * sessions endpoints, through the server's own parsing (src/server/server_impl.h declares
 * its parsers): the sampling and length parameters (parse_params, completions and
 * chat flavours), the messages (chat_messages, as for chat/completions and session append), the
 * tools (ib_api_tools, the messages in Qwen's tool form, a "reply" string read for tool calls) and
 * the session's kv policy. Whatever the body, the parsers must return a verdict with no crash, leak or
 * undefined behaviour; an accepted body must be within the limits.
 */
#include "server/server_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static server S;
    static ib_model_info info;
    if (!S.info) {
        S.o = ib_server_opts_default();
        info.max_context = 2048;
        info.vocab_size = 320;
        S.info = &info;
    }
    json_error_t je;
    json_t *b = json_loadb((const char *)data, size, 0, &je);
    if (!b) return 0;
    if (json_is_object(b)) {
        for (int chat = 0; chat < 2; chat++) {
            gen_params p;
            const char *param = NULL;
            char msg[256];
            if (parse_params(&S, b, chat, 16, &p, &param, msg, sizeof msg) == 0) {
                if (p.max_tokens < 0 || p.max_tokens > S.o.max_tokens || p.n_stops > MAX_STOPS) abort();
                if (p.top_lp < 0 || p.top_lp > IB_MAX_TOP_LOGPROBS) abort();
                params_free(&p);
            } else if (!param || !msg[0]) {
                abort();
            }
        }
        ib_chat_msg *cm = NULL;
        size_t nm = 0;
        char why[256];
        if (chat_messages(json_object_get(b, "messages"), &cm, &nm, why, sizeof why) == 0) {
            for (size_t i = 0; i < nm; i++)
                if (strcmp(cm[i].role, "system") && strcmp(cm[i].role, "user") && strcmp(cm[i].role, "assistant")) abort();
            free(cm);
        }
        /* tools: the request's tool use, its messages in Qwen's and Gemma 4's forms, and the body's
         * "reply" read for calls in both */
        ib_api_tool_use tu;
        const char *tparam = NULL;
        int trc = ib_api_tools(b, &tu, &tparam, why, sizeof why);
        if (trc && trc != -3 && (!tparam || !why[0])) abort();
        if (!trc && tu.mode == IB_TOOLS_FORCED && (!tu.forced || !tu.name[0])) abort();
        ib_api_tool_msgs tm;
        for (int form = IB_CHAT_TOOLS_QWEN; form <= IB_CHAT_TOOLS_GEMMA4; form++) {
            const char *mparam = NULL;
            int mrc = ib_api_tool_messages((ib_chat_tool_form)form, json_object_get(b, "messages"), trc ? NULL : tu.tools, &tm, &mparam, why,
                                           sizeof why);
            if (mrc == -1 && (!why[0] || !mparam || (strcmp(mparam, "messages") && strcmp(mparam, "tools")))) abort();
            if (mrc == 0) {
                for (size_t i = 0; i < tm.n; i++)
                    if (!tm.m[i].role || !tm.m[i].content || (tm.m[i].tool_text && form != IB_CHAT_TOOLS_GEMMA4)) abort();
                ib_api_tool_msgs_free(&tm);
            }
        }
        json_t *reply = json_object_get(b, "reply");
        if (json_is_string(reply)) {
            for (int form = 0; form < 2; form++) {
                size_t cl = 0;
                json_t *calls = ib_api_reply_tool_calls(form ? IB_CHAT_TOOLS_GEMMA4 : IB_CHAT_TOOLS_QWEN, json_string_value(reply),
                                                        json_string_length(reply), "x", 0, &cl);
                if (calls && (cl > json_string_length(reply) || json_array_size(calls) < 1)) abort();
                json_decref(calls);
            }
        }
        json_t *kv = json_object_get(b, "kv");
        int sink = 0, window = 0;
        if (json_is_string(kv) && ib_kv_policy_parse(json_string_value(kv), &sink, &window) == 0 && (sink < 0 || window < 0))
            abort();
    }
    json_decref(b);
    return 0;
}
