/*
 * cmd_info.c — `isobatch info`: architecture, sizes, quantization and memory of a model.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/kv_elem.h"
#include "isobatch.h"

static const char help[] = "usage: isobatch info [-m DIR] [--json] [--context N] [--kv-chunk C] [--kv-dtype T]\n"
                           "  Prints the architecture, sizes, quantization and the memory needed\n"
                           "  (weights + KV cache for one session of N tokens, default 4096, whose step\n"
                           "  items bring at most C tokens, default 64 as the server's --prefill-chunk:\n"
                           "  sliding-window layers keep sliding_window + C - 1 slots; 0: every position;\n"
                           "  its keys and values as T: f32, the default, f16 or q8).\n";

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    int as_json = 0;
    long ctx = 4096, chunk = 64;
    ib_kv_dtype kvd = IB_KV_F32;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(f, "--json")) as_json = 1;
        else if (!strcmp(f, "-m")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            dir = v;
        } else if (!strcmp(f, "--context")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 1, 1 << 24, &ctx)) return 2;
        } else if (!strcmp(f, "--kv-chunk")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 0, 1 << 20, &chunk)) return 2;
        } else if (!strcmp(f, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_kv_dtype(v, &kvd)) return 2;
        } else
            return cli_unknown_option("info", f, help);
    }
    if (!(dir = cli_model_dir(dir))) return 2;
    ib_model *m;
    ib_error err;
    if (ib_model_load(dir, NULL, &m, &err)) return cli_error("%s", err.msg);
    const ib_model_info *in = ib_model_get_info(m);
    if (ctx > in->max_context) ctx = in->max_context;   /* a session holds at most the model's context */
    ib_session_opts so = {.max_context = (int)ctx, .kv_chunk = (int)chunk, .kv_dtype = kvd};
    if (ib_session_check(m, &so, &err)) { /* e.g. q8 with head dims that are not multiples of 32 */
        ib_model_free(m);
        return cli_error("%s", err.msg);
    }
    size_t kv = ib_session_kv_bytes_for(m, &so);   /* what ib_session_create allocates, rings included */
    /* per token in that type: the model's figures count float32 elements */
    const size_t per_token = ib_kv_bytes_per_token(m, kvd),
                 per_token_sliding = ib_kv_bytes(kvd, in->kv_bytes_per_token_sliding / sizeof(float));
    if (as_json) {
        json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:I}",
                              "model", dir, "arch", in->arch, "vocab_size", in->vocab_size, "hidden_size", in->hidden_size,
                              "layers", in->n_layers, "heads", in->n_heads, "kv_heads", in->n_kv_heads, "head_dim",
                              in->head_dim, "intermediate_size", in->intermediate_size, "max_context", in->max_context,
                              "eos_id", in->eos_id, "rope_theta", (double)in->rope_theta, "rms_eps", (double)in->rms_eps,
                              "tied_embeddings", in->tied_embeddings, "quant_bits", in->quant_bits, "quant_group",
                              in->quant_group, "params", (json_int_t)in->n_params, "file_bytes", (json_int_t)in->file_bytes,
                              "weight_bytes", (json_int_t)in->weight_bytes, "kv_bytes_per_token",
                              (json_int_t)per_token, "kv_bytes_per_session", (json_int_t)kv);
        json_object_set_new(o, "weight_dtype", json_string(in->weight_dtype));
        json_object_set_new(o, "kv_chunk", json_integer(chunk));
        json_object_set_new(o, "kv_dtype", json_string(ib_kv_dtype_name(kvd)));
        if (in->sliding_window > 0) {
            json_object_set_new(o, "sliding_window", json_integer(in->sliding_window));
            json_object_set_new(o, "kv_bytes_per_token_sliding", json_integer((json_int_t)per_token_sliding));
        }
        if (in->n_double_wide > 0) { /* use_double_wide_mlp: the KV-shared layers' MLPs, as loaded */
            json_object_set_new(o, "double_wide_layers", json_integer(in->n_double_wide));
            json_object_set_new(o, "double_wide_intermediate_size", json_integer(2 * (json_int_t)in->intermediate_size));
        }
        if (in->n_experts > 0) {
            json_object_set_new(o, "experts", json_integer(in->n_experts));
            json_object_set_new(o, "experts_per_token", json_integer(in->top_k));
            json_object_set_new(o, "expert_intermediate_size", json_integer(in->moe_intermediate_size));
        }
        char *s = json_dumps(o, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("model        %s\n", dir);
        printf("architecture %s (%s)\n", in->arch, in->tied_embeddings ? "tied embeddings" : "separate lm_head");
        printf("parameters   %.2f M\n", in->n_params / 1e6);
        printf("vocab        %d\n", in->vocab_size);
        printf("layers       %d, hidden %d, ffn %d\n", in->n_layers, in->hidden_size, in->intermediate_size);
        if (in->n_double_wide > 0)
            printf("             %d KV-shared layers with ffn %d (use_double_wide_mlp)\n", in->n_double_wide,
                   2 * in->intermediate_size);
        if (in->n_experts > 0)
            printf("experts      %d per layer, %d per token, expert ffn %d (beside the dense ffn)\n", in->n_experts,
                   in->top_k, in->moe_intermediate_size);
        printf("attention    %d heads, %d kv heads, head_dim %d, rope_theta %g, max context %d\n", in->n_heads,
               in->n_kv_heads, in->head_dim, in->rope_theta, in->max_context);
        if (in->quant_bits)
            printf("weights      %s, %d-bit, group %d\n", in->weight_dtype, in->quant_bits, in->quant_group);
        else
            printf("weights      %s\n", in->weight_dtype);
        printf("files        %.1f MB\n", in->file_bytes / 1e6);
        printf("in memory    %.1f MB weights (repacked)\n", in->weight_bytes / 1e6);
        printf("kv cache     %zu bytes per token (%s); %.1f MB per session of %ld tokens\n", per_token,
               ib_kv_dtype_name(kvd), kv / 1e6, ctx);
        if (in->sliding_window > 0) {
            long slots = chunk > 0 && in->sliding_window + chunk - 1 < ctx ? in->sliding_window + chunk - 1 : ctx;
            printf("             sliding-window layers (window %d): %zu of those bytes per token, %ld slots each "
                   "(steps of at most %ld tokens)\n", in->sliding_window, per_token_sliding, slots, chunk);
        }
    }
    ib_model_free(m);
    return 0;
}
