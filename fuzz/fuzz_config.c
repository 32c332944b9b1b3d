/*
 * fuzz_config.c — libFuzzer target: any bytes as config.json. A config that loads must have sizes
 * the model code can use (positive, head_dim even, heads divisible by KV heads); one that does not
 * must leave a one-line message.
 */
#include <stdint.h>

#include "fuzz_common.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fz_write("config.json", data, size);
    ib_config c;
    ib_error err = {0};
    if (ib_config_load(p, &c, &err) == IB_OK) {
        if (c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
            c.head_dim % 2 || c.n_heads % c.n_kv_heads || c.vocab_size <= 0 || c.max_position <= 0)
            abort();
    } else if (!err.msg[0] || strchr(err.msg, '\n')) {
        abort();
    }
    return 0;
}
