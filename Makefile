# isobatch — build rules. `make` builds build/isobatch (the CLI) and build/libisobatch.a;
# `make test` builds and runs every test; `make asan` builds the sanitizer variant used by the
# bad-input tests; `make examples` builds examples/.
CC      ?= cc
BUILD   ?= build
# The sanitizer build's folder (`make asan`); tests/*.sh read it from the environment.
ASAN_BUILD ?= build-asan
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
# Flags the build needs whatever the user's CFLAGS say (`make CFLAGS=-O3` keeps them): the language
# level, warnings, include paths, dependency files. -fvect-cost-model=dynamic -fno-trapping-math let
# loops over independent lanes vectorize (this never reorders a float reduction: that would need
# -fassociative-math, which is never given).
IB_BASE_FLAGS := -std=c11 -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing \
           -fvect-cost-model=dynamic -fno-trapping-math \
           -D_GNU_SOURCE -Iinclude -Isrc -pthread -MMD -MP
# The numeric contract's flags come after the user's, so no user flag can undo them: -ffp-contract=off
# (a fused multiply-add is written where one is meant, never introduced by the compiler: the same C
# must give the same bits on every ISA) and no fast-math. SAN_FLAGS: the sanitizer build's (`make asan`).
IB_NUMERIC_FLAGS := -ffp-contract=off -fno-fast-math
ALL_CFLAGS = $(IB_BASE_FLAGS) $(CFLAGS) $(SAN_FLAGS) $(IB_NUMERIC_FLAGS)
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lsqlite3 -lm -pthread

SRC      := $(shell find src -name '*.c' | sort)
OBJ      := $(SRC:%.c=$(BUILD)/%.o)
TOOL_SRC := $(wildcard tools/*.c)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
EX_SRC   := $(wildcard examples/*.c)
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)

# Per-file ISA flags: only the kernels named *_avx2.c / *_avx512.c may use those instructions; the
# CPU is checked at run time before they are called. On other architectures those files compile to
# nothing. (matmul_neon.c needs no flags: Advanced SIMD is baseline on aarch64 and the dot-product
# functions carry their own target attribute; on other architectures it compiles to nothing.)
ifneq ($(filter x86_64% i386% i486% i586% i686%,$(shell $(CC) -dumpmachine)),)
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c
endif

.PHONY: all test asan examples clean run neon-test
all: $(BUILD)/isobatch $(BUILD)/libisobatch.a

$(BUILD)/libisobatch.a: $(OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/isobatch: $(TOOL_OBJ) $(BUILD)/libisobatch.a
	$(CC) $(ALL_CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libisobatch.a $(LDLIBS)

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libisobatch.a tests/check.h tests/test_rng.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< $(BUILD)/libisobatch.a $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libisobatch.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libisobatch.a $(LDLIBS)

examples: $(EX_BIN)

test: all asan $(TEST_BIN) $(EX_BIN)
	@BUILD=$(BUILD) ASAN_BUILD=$(ASAN_BUILD) bash tests/run.sh

# The main job: batched generation on the bundled default model (models/default, trained by train/),
# printing the text, tokens/s, and whether every row matched its serialized run.
RUN_MODEL ?= models/default
run: all
	./$(BUILD)/isobatch generate -m $(RUN_MODEL) --prompts-file examples/prompts.txt -n 32 --batch 8 --check-serial

# Sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer) in its own folder ($(ASAN_BUILD)). It also leaves out
# the AVX2 clones of the elementwise ops (IB_NO_CLONES), so tests can compare the two builds bitwise.
asan:
	$(MAKE) BUILD=$(ASAN_BUILD) SAN_FLAGS="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -DIB_NO_CLONES" \
	    LDLIBS="-ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lsqlite3 -lm -pthread -fsanitize=address,undefined" all $(patsubst $(BUILD)/%,$(ASAN_BUILD)/%,$(TEST_BIN))

# The NEON matmul kernel, tested under emulation on any host: tests/test_matmul_neon.c and the few
# sources it needs (no libraries beyond libc) cross-built statically for aarch64, then run under
# qemu-aarch64 on a CPU with the int8 dot product (-cpu max) and on one without (-cpu cortex-a57).
# Needs the Debian packages gcc-aarch64-linux-gnu and qemu-user; tests/t_neon.sh skips without them.
CROSS_CC  ?= aarch64-linux-gnu-gcc
QEMU_A64  ?= qemu-aarch64
NEON_SRC  := src/ops/matmul.c src/backends/cpu/matmul_scalar.c src/backends/cpu/matmul_neon.c \
             src/backends/cpu/isa.c src/core/pool.c src/core/status.c src/core/fault.c
NEON_TEST := $(BUILD)/aarch64/test_matmul_neon

$(NEON_TEST): tests/test_matmul_neon.c $(NEON_SRC) $(wildcard src/ops/*.h src/backends/cpu/*.h src/core/*.h) include/isobatch.h tests/check.h tests/test_rng.h
	@mkdir -p $(@D)
	$(CROSS_CC) $(filter-out -MMD -MP,$(ALL_CFLAGS)) -Itests -static -o $@ tests/test_matmul_neon.c $(NEON_SRC) -lm -pthread

# The attention copies too (on aarch64 the portable one, with NEON half conversion): tests/test_attention_isa.c.
NEON_ATT_SRC  := src/ops/attention.c src/ops/attention_avx2.c src/ops/attention_avx512.c src/core/fmath.c \
                 src/core/half.c src/backends/cpu/isa.c src/backends/cpu/matmul_scalar.c \
                 src/backends/cpu/matmul_neon.c src/core/fault.c
NEON_ATT_TEST := $(BUILD)/aarch64/test_attention_isa

$(NEON_ATT_TEST): tests/test_attention_isa.c $(NEON_ATT_SRC) $(wildcard src/ops/*.h src/backends/cpu/*.h src/core/*.h) include/isobatch.h tests/check.h tests/test_rng.h
	@mkdir -p $(@D)
	$(CROSS_CC) $(filter-out -MMD -MP,$(ALL_CFLAGS)) -Itests -static -o $@ tests/test_attention_isa.c $(NEON_ATT_SRC) -lm -pthread

neon-test: $(NEON_TEST) $(NEON_ATT_TEST)
	$(QEMU_A64) -cpu max $(NEON_TEST)
	$(QEMU_A64) -cpu cortex-a57 $(NEON_TEST)
	$(QEMU_A64) -cpu max $(NEON_ATT_TEST)

clean:
	rm -rf build build-asan

-include $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_BIN:=.d) $(EX_BIN:=.d)
