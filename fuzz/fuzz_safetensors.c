/*
 * fuzz_safetensors.c — libFuzzer target: any bytes as model.safetensors. A file that opens must have
 * every tensor inside the mapping (each byte is read, so ASan sees an overrun) and its size equal to
 * its shape; a file that does not must leave a one-line message.
 */
#include <stdint.h>

#include "fuzz_common.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fz_write("model.safetensors", data, size);
    ib_st_set *s = NULL;
    ib_error err = {0};
    if (ib_st_open_file(p, &s, &err) == IB_OK) {
        unsigned sum = 0;
        for (int i = 0; i < ib_st_count(s); i++) {
            const ib_st_tensor *t = ib_st_at(s, i);
            for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
            if (ib_st_find(s, t->name) != t) abort();
        }
        (void)sum;
        ib_st_close(s);
    } else {
        if (!err.msg[0] || strchr(err.msg, '\n')) abort();
        ib_st_close(s);
    }
    return 0;
}
