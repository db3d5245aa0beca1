# River build. `make` builds the library, the tools and the tests; `make test` runs the Check
# suites; `make demo` runs the main job. Each of them first installs the Debian packages the
# build needs (scripts/install-deps.sh) when they are missing.
#
# Variables: PREFIX (install root, /usr/local), SANITIZE (e.g. address,undefined),
# OPT (optimisation flags), V=1 (echo commands), CUDA (0: no CUDA backend, 1: require it,
# default: when nvcc is there), CUDA_ARCHS (compute capabilities, "80 86 89 90"; PTX of the
# newest is embedded as well).

PREFIX      ?= /usr/local
BUILD       ?= build
CC          ?= gcc
OPT         ?= -O2
SANITIZE    ?=

PKGS        := jansson libpcre2-8 libutf8proc
PKG_CFLAGS  := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_LIBS  := $(shell pkg-config --libs check 2>/dev/null)

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -Wshadow \
               -Wno-unused-parameter -fno-strict-aliasing -pthread -MMD -MP -I. $(PKG_CFLAGS)
ifneq ($(SANITIZE),)
# A sanitizer finding fails the run: UBSan otherwise prints and carries on.
CFLAGS_BASE += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS     += -fsanitize=$(SANITIZE)
endif
CFLAGS      ?=
ALL_CFLAGS  := $(CFLAGS_BASE) $(CFLAGS)
LDLIBS      := $(PKG_LIBS) -lm -pthread

# Serving layer (protobuf-c messages, ZMQ framing, YAML config; CZMQ for CurveZMQ: zauth
# and zcert). The C code protoc-c generates from proto/*.proto goes to $(BUILD)/gen/proto/,
# never into the source tree, and is archived into libriver.a with the rest; sources
# include "proto/river_*.pb-c.h".
SERVE_PKGS  := libprotobuf-c libzmq libczmq yaml-0.1
ALL_CFLAGS  += -I$(BUILD)/gen $(shell pkg-config --cflags $(SERVE_PKGS) 2>/dev/null)
LDLIBS      += $(shell pkg-config --libs $(SERVE_PKGS) 2>/dev/null)
PROTOC_C    ?= protoc-c
PROTO_SRC   := $(wildcard proto/*.proto)
PROTO_GEN_C := $(PROTO_SRC:%.proto=$(BUILD)/gen/%.pb-c.c)
PROTO_GEN_H := $(PROTO_GEN_C:.c=.h)
PROTO_OBJ   := $(PROTO_GEN_C:.c=.o)

# SIMD kernels are compiled per file with their own target flags and picked at run time.
SIMD_AVX2   := -mavx2 -mfma -mf16c
SIMD_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c -mavx2

# The libraries, one a folder (docs/ARCHITECTURE.md, "Folders"), each its own archive under
# $(BUILD)/lib. A program links the ones it needs, highest first: LIB is the whole stack
# (offline/ is the river tool's alone). scripts/check-layers.sh keeps the includes to the
# same order, so a library never calls into one above it.
COMMON_SRC  := $(wildcard common/*.c)
KERNELS_SRC := $(wildcard kernels/*.c kernels/cpu/*.c kernels/opaque/*.c)
TEXT_SRC    := $(wildcard text/*.c)
MODEL_SRC   := $(wildcard model/*.c)
ENGINE_SRC  := $(wildcard engine/*.c)
OFFLINE_SRC := $(wildcard offline/*.c)
COMMON_OBJ  := $(COMMON_SRC:%.c=$(BUILD)/%.o)
KERNELS_OBJ := $(KERNELS_SRC:%.c=$(BUILD)/%.o)
TEXT_OBJ    := $(TEXT_SRC:%.c=$(BUILD)/%.o)
MODEL_OBJ   := $(MODEL_SRC:%.c=$(BUILD)/%.o)
ENGINE_OBJ  := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
OFFLINE_OBJ := $(OFFLINE_SRC:%.c=$(BUILD)/%.o)
COMMON_LIB  := $(BUILD)/lib/libriver_common.a
KERNELS_LIB := $(BUILD)/lib/libriver_kernels.a
TEXT_LIB    := $(BUILD)/lib/libriver_text.a
MODEL_LIB   := $(BUILD)/lib/libriver_model.a
ENGINE_LIB  := $(BUILD)/lib/libriver_engine.a
OFFLINE_LIB := $(BUILD)/lib/libriver_offline.a
LIB_OBJ     := $(COMMON_OBJ) $(KERNELS_OBJ) $(TEXT_OBJ) $(MODEL_OBJ) $(ENGINE_OBJ) $(OFFLINE_OBJ)
# The runtime stack a worker links, and the whole one.
RUNTIME_LIB := $(ENGINE_LIB) $(MODEL_LIB) $(TEXT_LIB) $(KERNELS_LIB) $(COMMON_LIB)
LIB         := $(OFFLINE_LIB) $(RUNTIME_LIB)
# Everything in one archive, for programs outside this tree (make install).
INSTALL_LIB := $(BUILD)/libriver.a

CLI_SRC     := $(wildcard cli/*.c)
CLI_OBJ     := $(CLI_SRC:%.c=$(BUILD)/%.o)
RIVER_BIN   := $(BUILD)/bin/river

# The serving processes: one directory each, one binary each. The client
# library is what other programs link to talk to riverd.
SERVE_LIBS  := $(shell pkg-config --libs libmicrohttpd libsystemd 2>/dev/null)
CLIENT_SRC  := $(wildcard client/*.c)
CLIENT_OBJ  := $(CLIENT_SRC:%.c=$(BUILD)/%.o)
CLIENT_LIB  := $(BUILD)/libriverclient.a
WORKER_SRC  := $(wildcard workers/*.c)
WORKER_OBJ  := $(WORKER_SRC:%.c=$(BUILD)/%.o)
WORKER_BIN  := $(if $(WORKER_SRC),$(BUILD)/bin/river-worker)
DAEMON_SRC  := $(wildcard daemon/*.c)
DAEMON_OBJ  := $(DAEMON_SRC:%.c=$(BUILD)/%.o)
DAEMON_BIN  := $(if $(DAEMON_SRC),$(BUILD)/bin/riverd)
# river-soak (ops/river-soak.c) and river-cuda-bench (ops/river-cuda-bench.c, CUDA builds)
# are programs of their own; every other file in ops/ is riverctl's.
SOAK_SRC    := ops/river-soak.c
SOAK_OBJ    := $(SOAK_SRC:%.c=$(BUILD)/%.o)
SOAK_BIN    := $(BUILD)/bin/river-soak
OPS_SRC     := $(filter-out $(SOAK_SRC) ops/river-cuda-bench.c,$(wildcard ops/*.c))
OPS_OBJ     := $(OPS_SRC:%.c=$(BUILD)/%.o)
OPS_BIN     := $(if $(OPS_SRC),$(BUILD)/bin/riverctl)
SERVE_BINS  := $(WORKER_BIN) $(DAEMON_BIN) $(OPS_BIN)

# river-gateway (gateway/): the OpenAI-compatible HTTP server, a client of riverd over the
# client library; it logs like riverd (common/log.c) and takes SHA-256 from nettle for
# its API key file. Everything but gateway/main.c is also in the fuzz binaries: the request
# parser (openai.c) and the HTTP layer (http.c, with what it calls) are fuzz targets.
# `make test-openai` runs the official `openai` npm package against it (scripts/
# test-openai.sh: installed under $(BUILD)/npm at test time, never vendored); `make test`
# runs it too, as a suite of its own (TEST_SCRIPTS).
GATEWAY_SRC := $(wildcard gateway/*.c)
GATEWAY_OBJ := $(GATEWAY_SRC:%.c=$(BUILD)/%.o)
GATEWAY_BIN := $(if $(GATEWAY_SRC),$(BUILD)/bin/river-gateway)
GATEWAY_LIBS := $(shell pkg-config --libs nettle 2>/dev/null)
GATEWAY_FUZZ_OBJ := $(filter-out $(BUILD)/gateway/main.o,$(GATEWAY_OBJ))
SERVE_BINS  += $(GATEWAY_BIN)
TEST_SCRIPTS := scripts/test-openai.sh scripts/test-check-layers.sh scripts/test-run-tests.sh \
	scripts/test-llamacpp.sh
# The rules below come before `all`, which stays the default goal.
.DEFAULT_GOAL := all
$(GATEWAY_OBJ): | $(PROTO_GEN_H)
$(BUILD)/bin/river-gateway: $(GATEWAY_OBJ) $(CLIENT_LIB) $(TEXT_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(GATEWAY_OBJ) $(CLIENT_LIB) $(TEXT_LIB) $(COMMON_LIB) \
		$(LDLIBS) $(SERVE_LIBS) $(GATEWAY_LIBS)
.PHONY: test-openai build-test-openai
test-openai: deps-check
	$(Q)$(MAKE) --no-print-directory build-test-openai
build-test-openai: build-all
	$(Q)BUILD=$(BUILD) scripts/test-openai.sh
# River's quantized decode against llama.cpp (node-llama-cpp) on Llama 3.2 1B's shape, GGUF
# files and River's own q8/q4 checkpoints, with and without an exit (scripts/bench-quant.sh;
# ROUNDS, GEN, THREADS).
.PHONY: bench-quant build-bench-quant
bench-quant: deps-check
	$(Q)$(MAKE) --no-print-directory build-bench-quant
build-bench-quant: build-all
	$(Q)BUILD=$(BUILD) scripts/bench-quant.sh
# Prefill on Llama 3.2 1B's shape (bf16, River's q8/q4) against llama.cpp (node-llama-cpp)
# and the compute peak of every vector level, prompts of 128/512/2048 tokens
# (scripts/bench-prefill.sh; ROUNDS, LENS, THREADS).
.PHONY: bench-prefill build-bench-prefill
bench-prefill: deps-check
	$(Q)$(MAKE) --no-print-directory build-bench-prefill
build-bench-prefill: build-all
	$(Q)BUILD=$(BUILD) scripts/bench-prefill.sh

# One greedy stream through the gateway + riverd against riverd alone and `river run`.
.PHONY: bench-gateway build-bench-gateway
bench-gateway: deps-check
	$(Q)$(MAKE) --no-print-directory build-bench-gateway
build-bench-gateway: build-all
	$(Q)BUILD=$(BUILD) scripts/bench-gateway.sh
-include $(GATEWAY_OBJ:.o=.d)

TEST_SRC    := $(wildcard tests/test_*.c)
TEST_BIN    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(filter-out $(TEST_SRC) tests/bench_%.c,$(wildcard tests/*.c))
TEST_COMMON_OBJ := $(TEST_COMMON:%.c=$(BUILD)/%.o)

# CUDA backend (kernels/cuda/): built when nvcc is found ($(CUDA_HOME)/bin/nvcc, else on
# PATH). CUDA=0 leaves it out, CUDA=1 makes a missing toolkit an error. It goes into its
# own archive, linked before libriver.a (which it calls into) with cudart and cuBLAS; those
# are ordinary shared libraries, so linking needs no GPU (libcuda, the driver, is only
# loaded at run time by cudart). RIVER_CUDA tells C code the backend exists.
CUDA        ?= auto
CUDA_HOME   ?= /usr/local/cuda
CUDA_ARCHS  ?= 80 86 89 90
# PTX of the newest listed architecture goes into the fat binary too, so a GPU newer than
# every listed one JIT-compiles the kernels instead of failing with "no kernel image".
CUDA_PTX_ARCH ?= $(shell printf "%s\n" $(CUDA_ARCHS) | sort -n | tail -n 1)
NVCC        ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA),0)
CUDA_ON     :=
else ifneq ($(NVCC),)
CUDA_ON     := 1
else ifeq ($(CUDA),1)
$(error CUDA=1 but no nvcc in $(CUDA_HOME)/bin or on PATH)
else
CUDA_ON     :=
endif
ifeq ($(CUDA_ON),1)
CUDA_ROOT   := $(patsubst %/bin/nvcc,%,$(NVCC))
NVCC_FLAGS  := -std=c++17 -O2 -g -lineinfo -I. -I$(BUILD)/gen -MMD -MP -Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fno-strict-aliasing \
               $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
               -gencode=arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH)
CUDA_SRC    := $(wildcard kernels/cuda/*.cu)
CUDA_C_SRC  := $(wildcard kernels/cuda/*.c)
CUDA_OBJ    := $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(CUDA_C_SRC:%.c=$(BUILD)/%.o)
ALL_CFLAGS  += -DRIVER_CUDA
# The CUDA objects are members of the kernels archive; the toolkit's libraries follow the
# archives on every link line.
# NCCL (the split pair's device hand-off, kernels/cuda/cuda_nccl.c) ships in the toolkit's
# lib/ and include/ here; the C files of kernels/cuda/ see the toolkit's headers.
LDLIBS      := -L$(CUDA_ROOT)/lib64 -Wl,-rpath,$(CUDA_ROOT)/lib64 \
               -lnccl -lcublas -lcublasLt -lcudart -lstdc++ $(LDLIBS)
$(CUDA_C_SRC:%.c=$(BUILD)/%.o): ALL_CFLAGS += -I$(CUDA_ROOT)/include
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

.PHONY: all deps deps-check test demo install clean bench build-all build-test build-demo \
	build-install build-bench \
	bench-serving build-bench-serving soak build-soak

# The public targets first make sure the packages are there (cheap when they are), then
# re-run make so that pkg-config sees the installed libraries.
all test demo install bench bench-serving soak: deps-check
	$(Q)$(MAKE) --no-print-directory build-$@

deps-check:
	$(Q)scripts/install-deps.sh --quiet

build-all: $(LIB) $(INSTALL_LIB) $(CLIENT_LIB) $(RIVER_BIN) $(SERVE_BINS) $(SOAK_BIN) $(TEST_BIN)

deps:
	scripts/install-deps.sh

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) $(SIMD_AVX2) -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) $(SIMD_AVX512) -c $< -o $@

# The C files that test RIVER_CUDA are rebuilt when the setting changes in one BUILD
# directory (the stamp is rewritten only then): a stale object would reference a backend
# that is no longer linked.
CUDA_STAMP  := $(BUILD)/cuda-enabled
CUDA_USERS  := $(BUILD)/kernels/backend.o $(BUILD)/tests/test_cuda_ops.o \
               $(BUILD)/tests/test_backend_ops.o
$(CUDA_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo "$(CUDA_ON)" | cmp -s - $@ || echo "$(CUDA_ON)" > $@
$(CUDA_USERS): $(CUDA_STAMP)
FORCE:
.PHONY: FORCE

ifeq ($(CUDA_ON),1)
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(CUDA_OBJ): | $(PROTO_GEN_H)

# river-cuda-bench (ops/river-cuda-bench.c): per-kernel GB/s against a device-to-device copy.
CUDA_BENCH_BIN := $(BUILD)/bin/river-cuda-bench
$(CUDA_BENCH_BIN): $(BUILD)/ops/river-cuda-bench.o $(KERNELS_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(KERNELS_LIB) $(COMMON_LIB) $(LDLIBS)
build-all: $(CUDA_BENCH_BIN)
-include $(BUILD)/ops/river-cuda-bench.d
endif

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# One protoc-c run writes both files (a pattern rule with two targets is one recipe).
$(BUILD)/gen/proto/%.pb-c.c $(BUILD)/gen/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(dir $@)
	@echo "  PROTOC  $<"
	$(Q)$(PROTOC_C) --proto_path=. --c_out=$(BUILD)/gen $<

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# Generated headers include each other (imports), and any source may include them: every
# object waits for all of them on its first build (order-only); after that its -MMD
# dependency file names the headers it really includes, so a changed .proto rebuilds it.
$(PROTO_OBJ) $(LIB_OBJ) $(CLI_OBJ) $(TEST_BIN:=.o) $(TEST_COMMON_OBJ): | $(PROTO_GEN_H)
$(WORKER_OBJ) $(DAEMON_OBJ) $(OPS_OBJ) $(SOAK_OBJ) $(CLIENT_OBJ): | $(PROTO_GEN_H)

$(COMMON_LIB): $(COMMON_OBJ) $(PROTO_OBJ)
$(KERNELS_LIB): $(KERNELS_OBJ) $(CUDA_OBJ)
$(TEXT_LIB): $(TEXT_OBJ)
$(MODEL_LIB): $(MODEL_OBJ)
$(ENGINE_LIB): $(ENGINE_OBJ)
$(OFFLINE_LIB): $(OFFLINE_OBJ)
$(LIB) $(INSTALL_LIB):
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^
$(INSTALL_LIB): $(LIB_OBJ) $(PROTO_OBJ) $(CUDA_OBJ)

# One target a library: `make lib-text` builds text/ alone.
.PHONY: lib-common lib-kernels lib-text lib-model lib-engine lib-offline
lib-common: $(COMMON_LIB)
lib-kernels: $(KERNELS_LIB)
lib-text: $(TEXT_LIB)
lib-model: $(MODEL_LIB)
lib-engine: $(ENGINE_LIB)
lib-offline: $(OFFLINE_LIB)

$(RIVER_BIN): $(CLI_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

$(CLIENT_LIB): $(CLIENT_OBJ)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# Each program links only the libraries its folder may include (docs/ARCHITECTURE.md): the
# worker the runtime stack and nothing from cli/ or offline/, riverd common/ alone.
$(BUILD)/bin/river-worker: $(WORKER_OBJ) $(RUNTIME_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(WORKER_OBJ) $(RUNTIME_LIB) $(LDLIBS) $(SERVE_LIBS)

$(BUILD)/bin/riverd: $(DAEMON_OBJ) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(DAEMON_OBJ) $(COMMON_LIB) $(LDLIBS) $(SERVE_LIBS)

$(BUILD)/bin/riverctl: $(OPS_OBJ) $(CLIENT_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(OPS_OBJ) $(CLIENT_LIB) $(COMMON_LIB) $(LDLIBS) $(SERVE_LIBS)

$(SOAK_BIN): $(SOAK_OBJ) $(CLIENT_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(SOAK_OBJ) $(CLIENT_LIB) $(COMMON_LIB) $(LDLIBS)

# Test binaries run from the repository root; integration suites start the serving
# binaries, so those are built first.
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_COMMON_OBJ) $(LIB) $(CLIENT_LIB) | $(SERVE_BINS) $(RIVER_BIN)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(filter $(FUZZ_WORKER_OBJ) $(SCHEMA_OBJ) $(GATEWAY_KEYS_OBJ),$^) $(TEST_COMMON_OBJ) $(CLIENT_LIB) $(LIB) $(CHECK_LIBS) $(LDLIBS) $(SERVE_LIBS) \
		$(GATEWAY_LIBS)

# The include matrix of scripts/check-layers.sh (docs/ARCHITECTURE.md, "Folders"); `make
# test` runs it as a suite (scripts/test-check-layers.sh), with a tree that breaks it.
.PHONY: check-layers
check-layers:
	$(Q)scripts/check-layers.sh

build-test: build-all
	$(Q)BUILD=$(BUILD) scripts/run-tests.sh $(filter-out $(MULTIHOST_BIN),$(TEST_BIN)) $(TEST_SCRIPTS)

# The engine suites again on the opaque backend (kernels/opaque/opaque.h): the CPU kernels
# behind memory that nothing above the op interface may touch, so a host-side read of a
# buffer, a KV page or a weight crashes there, and a weight that was never placed is an
# error. This is how a missing upload is caught without a GPU.
OPAQUE_SUITES := backend backend_ops golden exit generate router worker split
.PHONY: test-opaque build-test-opaque
test-opaque: deps-check
	$(Q)$(MAKE) --no-print-directory build-test-opaque
build-test-opaque: build-all
	$(Q)RIVER_TEST_DEVICE=opaque scripts/run-tests.sh $(OPAQUE_SUITES:%=$(BUILD)/tests/test_%)

# Workers on other hosts: riverd, workers and clients in network namespaces of their own,
# over tcp:// with CURVE, with links cut, lossy and slow (tests/test_multihost.c). Needs
# root (iproute2 and iptables, which install-deps.sh installs); where namespaces cannot be
# made it says so and passes. Not part of `make test`: CI runs it after it (.ci/run).
MULTIHOST_BIN := $(BUILD)/tests/test_multihost
.PHONY: test-multihost build-test-multihost
test-multihost: deps-check
	$(Q)$(MAKE) --no-print-directory build-test-multihost
build-test-multihost: build-all
	$(Q)scripts/run-tests.sh $(MULTIHOST_BIN)

# libFuzzer: one binary per parser entry point in fuzz/targets.c, each run for FUZZ_SECONDS
# on its seeds (fuzz/corpus/<target>/; what it finds new goes to $(BUILD)/fuzz/corpus/).
# The library is rebuilt with clang and coverage in its own build directory. A crash leaves
# its input in $(BUILD)/fuzz/crash-<target>-*: fix it, then keep it in fuzz/regress/<target>/
# (tests/test_fuzz_regress.c replays those in `make test`). FUZZ=name runs one target. The
# parsers never reach a GPU, so the fuzz build leaves CUDA out. Its first build is slow
# (clang instruments the AVX-512 kernels for minutes); later runs reuse it.
FUZZ_SECONDS ?= 60
# The split-pair target drives the worker's pair code (and what it calls of the link; the
# log is common/log.c); the regression suite, which runs every target, links it too.
# riverd's and the worker's configuration schemas, for the config suite and the targets that
# read those files without the programs.
SCHEMA_OBJ := $(BUILD)/daemon/config_schema.o $(BUILD)/workers/config_schema.o
FUZZ_WORKER_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard workers/pair*.c)) \
                   $(BUILD)/workers/link.o $(SCHEMA_OBJ) \
                   $(GATEWAY_FUZZ_OBJ)
$(BUILD)/tests/test_fuzz_regress: $(FUZZ_WORKER_OBJ)
# The split suite checks the transport choice (workers/pair_transport.c) in process too.
$(BUILD)/tests/test_split: $(FUZZ_WORKER_OBJ)
# The gateway suite checks the API key set and the tenants' rates in process too.
GATEWAY_KEYS_OBJ := $(if $(GATEWAY_SRC),$(BUILD)/gateway/apikeys.o $(BUILD)/gateway/tenants.o \
                    $(BUILD)/gateway/errors.o)
$(BUILD)/tests/test_gateway: $(GATEWAY_KEYS_OBJ)
$(BUILD)/tests/test_config: $(SCHEMA_OBJ)
$(BUILD)/tests/test_toolcall: $(filter $(BUILD)/gateway/toolcall%,$(GATEWAY_OBJ))
FUZZ_BUILD   ?= build-fuzz
FUZZ_ALL     := $(shell sed -n 's/^    {"\([a-z0-9_]*\)", fuzz_[a-z0-9_]*},$$/\1/p' fuzz/targets.c)
FUZZ         ?= $(FUZZ_ALL)
FUZZ_BINS    := $(FUZZ:%=$(BUILD)/fuzz/fuzz_%)

.PHONY: fuzz build-fuzz
fuzz:
	$(Q)scripts/install-deps.sh --quiet --fuzz
	$(Q)$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang CUDA=0 \
		SANITIZE=fuzzer-no-link,address,undefined build-fuzz

$(BUILD)/fuzz/targets.o: | $(PROTO_GEN_H)

$(BUILD)/fuzz/main_%.o: fuzz/libfuzzer.c
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -DFUZZ_TARGET=$* -c $< -o $@

$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/main_%.o $(BUILD)/fuzz/targets.o $(FUZZ_WORKER_OBJ) \
		$(CLIENT_LIB) $(LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS) $(SERVE_LIBS) $(GATEWAY_LIBS)

build-fuzz: $(FUZZ_BINS)
	$(Q)rc=0; for t in $(FUZZ); do \
		log=$(BUILD)/fuzz/$$t.log; mkdir -p $(BUILD)/fuzz/corpus/$$t; \
		echo "== fuzz $$t ($(FUZZ_SECONDS) s, log in $$log)"; \
		$(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
			-print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/crash-$$t- \
			$(BUILD)/fuzz/corpus/$$t fuzz/corpus/$$t >$$log 2>&1 || { rc=1; \
			grep -E '^==[0-9]+==ERROR|^SUMMARY|Test unit written|runtime error' $$log; }; \
		grep -E '^stat::number_of_executed_units|^stat::peak_rss' $$log; \
	done; exit $$rc

# Seeds for the targets whose inputs only a real encoder makes (fuzz/seeds.c: river and
# router files of the targets' tiny model, riverd's replies, the split pair's frames);
# rewrites fuzz/corpus/{river,router,client_reply,admin_reply,pair,gguf}/.
.PHONY: fuzz-seeds
fuzz-seeds: deps-check
	$(Q)$(MAKE) --no-print-directory $(BUILD)/fuzz/seeds
	$(Q)$(BUILD)/fuzz/seeds

$(BUILD)/fuzz/seeds.o: | $(PROTO_GEN_H)
$(BUILD)/fuzz/seeds: $(BUILD)/fuzz/seeds.o $(FUZZ_WORKER_OBJ) $(CLIENT_LIB) $(LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

build-demo: build-all
	$(Q)scripts/demo.sh

# Concurrent streaming clients (1, 4, 8) through the gateway, riverd and a worker, plain and
# with a fixed exit, against llama.cpp's batched decoding (node-llama-cpp) on Llama 3.2 1B's
# shape; then one stream through riverd against in-process `river run`
# (scripts/bench-serving.sh; CLIENTS, ROUNDS, GEN, THREADS).
build-bench-serving: build-all
	$(Q)BUILD=$(BUILD) scripts/bench-serving.sh

# Soak: SOAK_STREAMS concurrent streams for SOAK_MINUTES against riverd and two local
# workers on the bundled TinyStories model (scripts/soak.sh, ops/river-soak.c); fails when
# a request is lost. SOAK_AUTH=curve|plain, SOAK_CLIENTS connections (default 1 per 50).
SOAK_STREAMS ?= 200
SOAK_MINUTES ?= 10
SOAK_AUTH    ?= curve
build-soak: build-all
	$(Q)BUILD=$(BUILD) SOAK_STREAMS=$(SOAK_STREAMS) SOAK_MINUTES=$(SOAK_MINUTES) \
		SOAK_SECONDS=$(SOAK_SECONDS) SOAK_AUTH=$(SOAK_AUTH) SOAK_CLIENTS=$(SOAK_CLIENTS) \
		SOAK_WRAP="$(SOAK_WRAP)" \
		scripts/soak.sh

# Decode speed against the memory roofline: stories260K on one thread, then a random-weight
# checkpoint of Llama 3.2 1B's shape in bf16 (written once under $(BUILD)/synth) on two.
SYNTH_1B := $(BUILD)/synth/llama-3.2-1b-bf16
build-bench: build-all
	$(Q)$(RIVER_BIN) bench --model tests/data/stories260K/stories260K.bin --threads 1
	$(Q)test -f $(SYNTH_1B)/model.safetensors || \
		$(RIVER_BIN) synth --shape llama-3.2-1b --dtype bf16 --out $(SYNTH_1B)
	$(Q)$(RIVER_BIN) bench --model $(SYNTH_1B) --threads 2

# The CPU matmul kernels alone (river bench --kernels): Llama 3.2 1B's matrix shapes from
# memory in bf16, Q8 (zeros 128 and any) and Q4X8 (g32, g64), at 1, 2, 4, 8 and 128 rows,
# every SIMD level, THREADS threads (default 2): ms per call, GB/s and the fraction of the
# read bandwidth. KERNEL_ARGS passes more options (--levels, --shapes, --formats, --runs).
THREADS ?= 2
.PHONY: bench-kernels build-bench-kernels
bench-kernels: deps-check
	$(Q)$(MAKE) --no-print-directory build-bench-kernels
build-bench-kernels: build-all
	$(Q)$(RIVER_BIN) bench --kernels --threads $(THREADS) $(KERNEL_ARGS)

# The grammar engine's token masks (text/grammar.h) over the Llama 3 vocabulary, one core:
# matcher build time, then median/p90/p99/max of grammar_state_mask per token for several
# JSON Schemas (tests/bench_grammar.c).
.PHONY: bench-grammar build-bench-grammar
bench-grammar: deps-check
	$(Q)$(MAKE) --no-print-directory build-bench-grammar
build-bench-grammar: $(BUILD)/tests/bench_grammar
	$(Q)$(BUILD)/tests/bench_grammar
$(BUILD)/tests/bench_grammar: $(BUILD)/tests/bench_grammar.o $(TEXT_LIB) $(COMMON_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(TEXT_LIB) $(COMMON_LIB) $(LDLIBS)

# Every SIMD level this processor has, forced with RIVER_SIMD: the op tests (which loop
# over the levels themselves), then the golden and exit suites once per level.
# bench-simd prints the speed figures of the AVX2 and AVX-512 paths side by side.
.PHONY: test-simd build-test-simd bench-simd build-bench-simd
test-simd bench-simd: deps-check
	$(Q)$(MAKE) --no-print-directory build-$@
build-test-simd: build-all
	$(Q)BUILD=$(BUILD) scripts/test-simd.sh
build-bench-simd: build-all
	$(Q)BUILD=$(BUILD) scripts/bench-simd.sh

build-install: build-all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/river $(DESTDIR)$(PREFIX)/lib \
		$(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/share/river/configs
	install -m 755 $(RIVER_BIN) $(SERVE_BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(INSTALL_LIB) $(CLIENT_LIB) $(DESTDIR)$(PREFIX)/lib/
	# Engine headers keep their directories, so their own includes resolve with
	# -I$(PREFIX)/include/river; river_client.h is the one header a client needs.
	for h in kernels/ops.h model/model.h text/tokenizer.h common/err.h; do \
		install -D -m 644 $$h $(DESTDIR)$(PREFIX)/include/river/$$h; done
	install -m 644 client/river_client.h $(DESTDIR)$(PREFIX)/include/river/
	sed 's|/usr/local|$(PREFIX)|g' deploy/riverd.service \
		> $(DESTDIR)$(PREFIX)/lib/systemd/system/riverd.service
	sed 's|/usr/local|$(PREFIX)|g' deploy/river-worker@.service \
		> $(DESTDIR)$(PREFIX)/lib/systemd/system/river-worker@.service
	install -m 644 configs/*.yaml $(DESTDIR)$(PREFIX)/share/river/configs/

clean:
	rm -rf $(BUILD)

.SECONDARY:

-include $(CLIENT_OBJ:.o=.d) $(WORKER_OBJ:.o=.d) $(DAEMON_OBJ:.o=.d) $(OPS_OBJ:.o=.d)
-include $(SOAK_OBJ:.o=.d)
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:=.d) $(TEST_COMMON_OBJ:.o=.d)
-include $(PROTO_OBJ:.o=.d) $(wildcard $(BUILD)/fuzz/*.d) $(CUDA_OBJ:.o=.d)

# The lent GPU machine has no -dev packages and no network: gpu-bundle builds here with the
# CUDA backend for the H200 (CUDA_ARCHS=90) into build-gpu and packs the binaries and the
# shared libraries that machine may lack into gpu-bundle/bundle.tar.xz, which
# scripts/gpu-check.sh unpacks and runs there (README, "GPU").
.PHONY: gpu-bundle
gpu-bundle: deps-check
	$(Q)$(MAKE) --no-print-directory BUILD=build-gpu CUDA=1 CUDA_ARCHS=90 build-all
	$(Q)scripts/gpu-bundle.sh build-gpu gpu-bundle
