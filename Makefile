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
# libpq's header lives in a folder of its own (Debian: /usr/include/postgresql).
PQ_CFLAGS := $(shell pkg-config --cflags libpq 2>/dev/null || echo -I/usr/include/postgresql)
IB_BASE_FLAGS := -std=c11 -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing \
           -fvect-cost-model=dynamic -fno-trapping-math \
           -D_GNU_SOURCE -Iinclude -Isrc -pthread -MMD -MP $(PQ_CFLAGS)
# The numeric contract's flags come after the user's, so no user flag can undo them: -ffp-contract=off
# (a fused multiply-add is written where one is meant, never introduced by the compiler: the same C
# must give the same bits on every ISA) and no fast-math. -fno-fast-math puts -ftrapping-math back, so
# -fno-trapping-math is given again after it (without it GCC if-converts no loop with a float select:
# SwiGLU's and attention's exponentials, among others, stayed scalar); it changes no value.
# SAN_FLAGS: the sanitizer build's (`make asan`).
IB_NUMERIC_FLAGS := -ffp-contract=off -fno-fast-math -fno-trapping-math
ALL_CFLAGS = $(IB_BASE_FLAGS) $(CFLAGS) $(SAN_FLAGS) $(IB_NUMERIC_FLAGS)
# The libraries the engine and its tools link (README, "Dependencies", says why each is there).
DEP_LIBS := -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lsqlite3 -lpq -lm -pthread
LDLIBS  += $(DEP_LIBS)

SRC      := $(shell find src -name '*.c' | sort)
OBJ      := $(SRC:%.c=$(BUILD)/%.o)

# The CUDA backend (src/backends/cuda/*.cu): built when nvcc is found (on the PATH or in
# /usr/local/cuda), left out cleanly otherwise (`make NVCC=` leaves it out too). It defines
# IB_HAVE_CUDA for every file and links the CUDA runtime statically, so the binaries need only the
# driver where a GPU is; without one the backend reports "no CUDA device". The numeric contract's
# flags: no fused multiply-add unless written (-fmad=false), IEEE division and square root, denormals
# kept; kernels for Hopper (sm_90a).
NVCC    ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifneq ($(strip $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCC_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcudart_static -ldl -lrt -lstdc++
# The nvcc found must compile a kernel for NVCC_ARCH and the result must link with CUDA_LIBS (an old
# or partial toolkit cannot): otherwise the backend is left out, said once, and the build goes on.
CUDA_WORKS := $(shell d=$$(mktemp -d 2>/dev/null) && printf '__global__ void k() {}\nint main() { k<<<1, 1>>>(); return 0; }\n' > $$d/t.cu && \
                $(NVCC) $(NVCC_ARCH) -c $$d/t.cu -o $$d/t.o >/dev/null 2>&1 && $(CC) -o $$d/t $$d/t.o $(CUDA_LIBS) -pthread >/dev/null 2>&1 && \
                echo yes; rm -rf "$$d")
ifeq ($(CUDA_WORKS),yes)
CU_SRC   := $(shell find src -name '*.cu' | sort)
OBJ      += $(CU_SRC:%.cu=$(BUILD)/%.o)
IB_BASE_FLAGS += -DIB_HAVE_CUDA
IB_NVCC_FLAGS := -std=c++17 -O3 -DIB_HAVE_CUDA -D_GNU_SOURCE -Iinclude -Isrc $(NVCC_ARCH) \
           -fmad=false -prec-div=true -prec-sqrt=true -ftz=false \
           -Xcompiler -fno-strict-aliasing,-ffp-contract=off,-fno-fast-math,-fPIC -MMD -MP
else
$(info isobatch: $(NVCC) cannot build and link a kernel for $(NVCC_ARCH): the CUDA backend is left out)
CUDA_LIBS :=
endif
endif
TOOL_SRC := $(wildcard tools/*.c)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Tests that run a CUDA kernel's device code on the host (tests/test_*_host.cc, C++ as the kernels are,
# through tests/cuda_host_shim.h): built by the host's C++ compiler, no nvcc or GPU needed.
CXX_TEST_SRC := $(wildcard tests/test_*.cc)
CXX_TEST_BIN := $(CXX_TEST_SRC:tests/%.cc=$(BUILD)/tests/%)
CXX_TEST_FLAGS = -std=c++17 $(filter-out -std=c11,$(IB_BASE_FLAGS)) -Wno-unknown-pragmas -Wno-unused-function $(CFLAGS) $(SAN_FLAGS) $(IB_NUMERIC_FLAGS)
# Test programs a tests/t_*.sh script runs with arguments (not run alone by tests/run.sh): the
# PostgreSQL store's checks need the private server tests/t_store_pg.sh starts.
HELPER_BIN := $(BUILD)/tests/pg_store_check
EX_SRC   := $(wildcard examples/*.c)
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)

# Per-file ISA flags: only the kernels named *_avx2.c / *_avx512.c / *_amx.c may use those instructions; the
# CPU is checked at run time before they are called. On other architectures those files compile to
# nothing. (matmul_neon.c needs no flags: Advanced SIMD is baseline on aarch64 and the dot-product
# functions carry their own target attribute; on other architectures it compiles to nothing.)
ifneq ($(filter x86_64% i386% i486% i586% i686%,$(shell $(CC) -dumpmachine)),)
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c
# matmul_amx.c: AVX-512 plus the AMX tile and int8 instructions (64-bit x86 only: elsewhere it compiles to nothing)
AMX_FLAGS    := $(AVX512_FLAGS) -mamx-tile -mamx-int8
endif

# The flags this build folder's objects are compiled with (the CUDA backend on or off among them),
# kept in $(BUILD)/flags.txt and rewritten only when they change: every object depends on it, so a
# build never mixes objects made with and without IB_HAVE_CUDA (e.g. after `make NVCC=`).
FLAGS_STAMP := $(BUILD)/flags.txt
FLAGS_NOW   := $(ALL_CFLAGS) | $(IB_NVCC_FLAGS) | $(CUDA_LIBS) | $(AVX2_FLAGS) | $(AVX512_FLAGS) | $(AMX_FLAGS)
$(shell mkdir -p $(BUILD) && { printf '%s\n' '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || printf '%s\n' '$(FLAGS_NOW)' > $(FLAGS_STAMP); })

.PHONY: gpu-bundle all test asan examples clean run neon-test
all: $(BUILD)/isobatch $(BUILD)/libisobatch.a

$(BUILD)/libisobatch.a: $(OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/isobatch: $(TOOL_OBJ) $(BUILD)/libisobatch.a
	$(CC) $(ALL_CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libisobatch.a $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/%_avx2.o: %_avx2.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/%_amx.o: %_amx.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AMX_FLAGS) -c $< -o $@

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(IB_NVCC_FLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libisobatch.a tests/check.h tests/test_rng.h $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< $(BUILD)/libisobatch.a $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/tests/%: tests/%.cc $(BUILD)/libisobatch.a tests/check.h tests/test_rng.h tests/cuda_host_shim.h tests/cuda_host_mat.h $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CXX_TEST_FLAGS) -Itests -o $@ $< $(BUILD)/libisobatch.a $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libisobatch.a $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libisobatch.a $(LDLIBS) $(CUDA_LIBS)

examples: $(EX_BIN)

# clang builds the fuzz targets (fuzz/); `make test` builds and runs them briefly when it is installed
FUZZ_CC      ?= clang
HAVE_FUZZ_CC := $(shell command -v $(FUZZ_CC) 2>/dev/null)
test: all asan $(TEST_BIN) $(CXX_TEST_BIN) $(HELPER_BIN) $(EX_BIN) $(if $(HAVE_FUZZ_CC),fuzz-build)
	@BUILD=$(BUILD) ASAN_BUILD=$(ASAN_BUILD) FUZZ_BUILD=$(FUZZ_BUILD) bash tests/run.sh

# The main job: batched generation on the bundled default model (models/default, trained by train/),
# printing the text, tokens/s, and whether every row matched its serialized run.
RUN_MODEL ?= models/default
run: all
	./$(BUILD)/isobatch generate -m $(RUN_MODEL) --prompts-file examples/prompts.txt -n 32 --batch 8 --check-serial

# The GPU checks' binaries for a machine with a GPU but without this project's -dev libraries (they are
# built here, with nvcc, and run there): isobatch and the test programs bench/cuda_full_check.sh,
# bench/gemma4_hf_check.sh and bench/amx_check.sh run, stripped, and lib/ with the shared libraries
# isobatch loads beyond the C and C++ runtimes (ldd); $(GPU_BUNDLE).tar.xz packs the folder. There:
# `bash bench/cuda_full_check.sh DIR OUT` with DIR the unpacked folder (it sets LD_LIBRARY_PATH to DIR/lib).
GPU_BUNDLE ?= $(BUILD)/gpu-bundle
GPU_BUNDLE_BIN := $(BUILD)/isobatch $(BUILD)/tests/test_backend_cuda $(BUILD)/tests/test_backend_ops \
                  $(BUILD)/tests/test_matmul $(BUILD)/tests/test_bigalloc
GPU_BUNDLE_SKIP := /(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libresolv)\.so|/ld-linux
gpu-bundle: $(GPU_BUNDLE_BIN)
	rm -rf $(GPU_BUNDLE) $(GPU_BUNDLE).tar.xz
	mkdir -p $(GPU_BUNDLE)/lib
	cp $(GPU_BUNDLE_BIN) $(GPU_BUNDLE)/
	strip $(addprefix $(GPU_BUNDLE)/,$(notdir $(GPU_BUNDLE_BIN)))
	ldd $(BUILD)/isobatch | awk '$$3 ~ /^\// {print $$3}' | grep -Ev '$(GPU_BUNDLE_SKIP)' | xargs -r cp -L -t $(GPU_BUNDLE)/lib/
	tar -cJf $(GPU_BUNDLE).tar.xz -C $(dir $(GPU_BUNDLE)) $(notdir $(GPU_BUNDLE))
	@echo "$(GPU_BUNDLE): $$(ls $(GPU_BUNDLE) | wc -l) entries, lib/ $$(ls $(GPU_BUNDLE)/lib | wc -l) libraries; $(GPU_BUNDLE).tar.xz $$(du -h $(GPU_BUNDLE).tar.xz | cut -f1)"

# Sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer) in its own folder ($(ASAN_BUILD)),
# without the CUDA backend (its device code cannot be sanitized on a GPU; the bad-input tests need the host
# side) — but with the host tests of the kernels (CXX_TEST_BIN), so a kernel reading or writing out of
# its bounds is caught on the host. It also leaves out the AVX2 clones of the elementwise ops
# (IB_NO_CLONES), so tests can compare the two builds bitwise.
asan:
	$(MAKE) BUILD=$(ASAN_BUILD) NVCC= SAN_FLAGS="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -DIB_NO_CLONES" \
	    LDLIBS="$(DEP_LIBS) -fsanitize=address,undefined" all $(patsubst $(BUILD)/%,$(ASAN_BUILD)/%,$(TEST_BIN) $(CXX_TEST_BIN) $(HELPER_BIN))

# The NEON matmul kernel, tested under emulation on any host: tests/test_matmul_neon.c and the few
# sources it needs (no libraries beyond libc) cross-built statically for aarch64, then run under
# qemu-aarch64 on a CPU with the int8 dot product (-cpu max) and on one without (-cpu cortex-a57).
# Needs the Debian packages gcc-aarch64-linux-gnu and qemu-user; tests/t_neon.sh skips without them.
CROSS_CC  ?= aarch64-linux-gnu-gcc
QEMU_A64  ?= qemu-aarch64
NEON_SRC  := src/ops/matmul.c src/backends/cpu/matmul_scalar.c src/backends/cpu/matmul_neon.c src/core/bigalloc.c \
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

# libFuzzer targets (fuzz/fuzz_*.c, seed corpora in fuzz/corpus/NAME): the library (CPU backend only) built again with
# clang under ASan/UBSan in $(FUZZ_BUILD). `make fuzz` runs each target for FUZZ_SECONDS on a copy
# of its seed corpus ($(FUZZ_BUILD)/corpus/NAME, kept between runs) and stops at the first finding;
# `make test` runs each for a few seconds (tests/t_fuzz.sh) when clang is installed.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_SAN     := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
                -fno-omit-frame-pointer -DIB_NO_CLONES
FUZZ_CFLAGS   = $(filter-out -fvect-cost-model=dynamic -DIB_HAVE_CUDA,$(IB_BASE_FLAGS)) $(FUZZ_SAN) $(IB_NUMERIC_FLAGS)
FUZZ_OBJ     := $(SRC:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_BIN     := $(patsubst fuzz/%.c,$(FUZZ_BUILD)/fuzz/%,$(wildcard fuzz/fuzz_*.c))

# The AVX2/AVX-512/AMX kernel copies take clang minutes each under the sanitizers and no fuzzed input
# reaches them: built as in the plain build, by $(CC).
$(FUZZ_BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/%_amx.o: %_amx.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(AMX_FLAGS) -c $< -o $@

$(FUZZ_BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

# The files whose CPU feature checks name a feature (f16c) clang 14's __builtin_cpu_supports lacks
# are built by $(CC), uninstrumented: feature detection and half-float conversion, which no fuzzed
# input reaches in a way a sanitizer would judge.
FUZZ_BY_CC := $(FUZZ_BUILD)/src/backends/cpu/isa.o $(FUZZ_BUILD)/src/core/half.o
$(FUZZ_BY_CC): $(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/libisobatch.a: $(FUZZ_OBJ)
	$(AR) rcs $@ $^

$(FUZZ_BUILD)/fuzz/%: fuzz/%.c fuzz/fuzz_common.h $(FUZZ_BUILD)/libisobatch.a
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libisobatch.a $(LDLIBS)

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BIN)

fuzz: fuzz-build
	@for f in $(FUZZ_BIN); do n=$${f##*/fuzz_}; mkdir -p $(FUZZ_BUILD)/corpus/$$n; \
	    echo "== $$f: $(FUZZ_SECONDS) s"; \
	    $$f -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus/$$n fuzz/corpus/$$n || exit 1; done

clean:
	rm -rf build build-asan build-fuzz

-include $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_BIN:=.d) $(CXX_TEST_BIN:=.d) $(HELPER_BIN:=.d) $(EX_BIN:=.d) $(FUZZ_OBJ:.o=.d) $(FUZZ_BIN:=.d)

# ---- the linkable library: shared library, pkg-config file, install (rules kept apart from the build above)
# The version comes from include/isobatch.h (IB_VERSION_*), its one home. The library's objects are
# position-independent so the same objects make libisobatch.a and libisobatch.so (-fPIC changes no
# arithmetic; -fno-semantic-interposition keeps calls inside the library direct).
IB_VERSION := $(shell sed -n 's/^\#define IB_VERSION_STRING "\(.*\)"/\1/p' include/isobatch.h)
IB_SOMAJOR := $(firstword $(subst ., ,$(IB_VERSION)))
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    ?= $(PREFIX)/share
SHLIB      := $(BUILD)/libisobatch.so.$(IB_VERSION)
LIB_LDLIBS := $(DEP_LIBS) $(CUDA_LIBS)

$(OBJ): ALL_CFLAGS += -fPIC -fno-semantic-interposition
# objects of a build folder made before its library became position-independent are rebuilt once
# (the stamp is newer than they are); afterwards the stamp is older than every object
$(OBJ): $(BUILD)/.pic-objects
$(BUILD)/.pic-objects:
	@mkdir -p $(@D)
	@touch $@

.PHONY: shared install uninstall
all: $(SHLIB) $(BUILD)/isobatch.pc $(BUILD)/isobatch-static.pc
shared: $(SHLIB)

$(SHLIB): $(OBJ)
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libisobatch.so.$(IB_SOMAJOR) -o $@ $(OBJ) $(LIB_LDLIBS) $(filter -fsanitize=%,$(SAN_FLAGS))
	ln -sf libisobatch.so.$(IB_VERSION) $(BUILD)/libisobatch.so.$(IB_SOMAJOR)
	ln -sf libisobatch.so.$(IB_SOMAJOR) $(BUILD)/libisobatch.so

# pkg-config files, written for the PREFIX/LIBDIR/INCLUDEDIR of the make that writes them (install
# writes its own, so `make install PREFIX=...` never ships a stale prefix). isobatch-static names
# libisobatch.a itself, so the static library is used even where the shared one sits beside it.
# $(call ib_pc,NAME,DESCRIPTION,LIBS,FILE)
ib_pc = printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' 'Name: $(1)' \
    'Description: $(2)' 'Version: $(IB_VERSION)' 'Libs: $(3)' 'Cflags: -I$${includedir}' > $(4)
IB_PC_DESC := LLM serving runtime whose batched logits are bitwise those of unbatched decoding

$(BUILD)/isobatch.pc: include/isobatch.h Makefile
	@mkdir -p $(@D)
	$(call ib_pc,isobatch,$(IB_PC_DESC),-L$${libdir} -lisobatch,$@)
	printf 'Libs.private: %s\n' '$(LIB_LDLIBS)' >> $@

$(BUILD)/isobatch-static.pc: include/isobatch.h Makefile
	@mkdir -p $(@D)
	$(call ib_pc,isobatch-static,$(IB_PC_DESC) (static),$${libdir}/libisobatch.a $(LIB_LDLIBS),$@)

# make install [PREFIX=/usr/local] [DESTDIR=/staging]: the tool, both libraries, the header, the
# pkg-config file and the bundled default model (the tool finds it in $(DATADIR)/isobatch/models/default).
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 755 $(BUILD)/isobatch $(DESTDIR)$(BINDIR)/isobatch
	install -m 644 $(BUILD)/libisobatch.a $(DESTDIR)$(LIBDIR)/libisobatch.a
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/libisobatch.so.$(IB_VERSION)
	ln -sf libisobatch.so.$(IB_VERSION) $(DESTDIR)$(LIBDIR)/libisobatch.so.$(IB_SOMAJOR)
	ln -sf libisobatch.so.$(IB_SOMAJOR) $(DESTDIR)$(LIBDIR)/libisobatch.so
	install -m 644 include/isobatch.h $(DESTDIR)$(INCLUDEDIR)/isobatch.h
	$(call ib_pc,isobatch,$(IB_PC_DESC),-L$${libdir} -lisobatch,$(DESTDIR)$(LIBDIR)/pkgconfig/isobatch.pc)
	printf 'Libs.private: %s\n' '$(LIB_LDLIBS)' >> $(DESTDIR)$(LIBDIR)/pkgconfig/isobatch.pc
	$(call ib_pc,isobatch-static,$(IB_PC_DESC) (static),$${libdir}/libisobatch.a $(LIB_LDLIBS),$(DESTDIR)$(LIBDIR)/pkgconfig/isobatch-static.pc)
	if [ -f models/default/model.safetensors ]; then \
	    install -d $(DESTDIR)$(DATADIR)/isobatch/models/default && \
	    install -m 644 models/default/*.json models/default/model.safetensors $(DESTDIR)$(DATADIR)/isobatch/models/default/; fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/isobatch $(DESTDIR)$(LIBDIR)/libisobatch.a $(DESTDIR)$(LIBDIR)/libisobatch.so \
	    $(DESTDIR)$(LIBDIR)/libisobatch.so.$(IB_SOMAJOR) $(DESTDIR)$(LIBDIR)/libisobatch.so.$(IB_VERSION) \
	    $(DESTDIR)$(INCLUDEDIR)/isobatch.h $(DESTDIR)$(LIBDIR)/pkgconfig/isobatch.pc \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/isobatch-static.pc
	rm -rf $(DESTDIR)$(DATADIR)/isobatch
