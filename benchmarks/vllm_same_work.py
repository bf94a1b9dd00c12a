"""The peer a user would write instead of specrag, for benchmarks/peers.py: standard RAG over a
Parquet of questions as one plain script, with no specrag in it.

It reads the questions' Parquet, searches the same bm25s index (bm25s's own ``retrieve``, the
tokenizer and stemmer specrag's index was built with), builds the same prompt text, answers with
vLLM's offline ``LLM.chat`` (the model's chat template, greedy, the same stop string, token limit
and end-of-sequence ids) and writes the answers as Parquet. All of it is timed, as specrag's whole
job is; the model load (and vLLM's compile) is timed apart, as for every system.

Run by the vLLM venv's Python (``.venv-vllm/bin/python``: bm25s, PyStemmer and pyarrow are in its
lock for this script) with the environment ``VllmServer.environment()`` builds; reads a JSON job
on stdin and prints one JSON line after ``RESULT`` (vLLM logs to stdout as well).
"""
import json
import sys
import time

RESULT = "SAME_WORK_VLLM_RESULT "


def format_documents(titles, texts, max_chars):
    """Numbered documents, long ones clipped at a word: the prompt a user copies from specrag's
    documentation (a peer must not import specrag, so the five lines are its own)."""
    lines = []
    for i, (title, text) in enumerate(zip(titles, texts), 1):
        text = text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0] + " ..."
        lines.append(f"[{i}] {title}: {text}" if title else f"[{i}] {text}")
    return "\n".join(lines)


def main() -> int:
    job = json.load(sys.stdin)
    started = time.perf_counter()
    from vllm import LLM, SamplingParams
    llm = LLM(model=job["folder"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0,
              enable_prefix_caching=True, generation_config="vllm", max_num_seqs=job["max_num_seqs"])
    llm.chat([[{"role": "user", "content": "Hello"}]], SamplingParams(max_tokens=2), use_tqdm=False)
    loaded = time.perf_counter()

    start = time.perf_counter()
    import bm25s
    import pyarrow as pa
    import pyarrow.parquet as pq
    import Stemmer
    queries = pq.read_table(job["queries"], columns=["id", "question"]).to_pylist()[:job["limit"]]
    passages = pq.read_table(job["passages"], columns=["id", "title", "text"])
    ids, titles, texts = (passages.column(c).to_pylist() for c in ("id", "title", "text"))
    index = bm25s.BM25.load(job["bm25"])
    tokens = bm25s.tokenize([q["question"] for q in queries], stopwords="en", stemmer=Stemmer.Stemmer("english"),
                            show_progress=False)
    rows, _ = index.retrieve(tokens, k=job["k"], show_progress=False, n_threads=1)
    searched = time.perf_counter()
    conversations = [[{"role": "user", "content": "\n\n".join([
        job["instruction"], "Documents:\n" + format_documents([titles[r] for r in found], [texts[r] for r in found],
                                                              job["max_chars"]),
        f"Question: {q['question']}"]) + "\nAnswer:"}] for q, found in zip(queries, rows)]
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], stop=job["stop"],
                            stop_token_ids=job["eos_ids"])
    outputs = llm.chat(conversations, params, use_tqdm=False)
    generated = time.perf_counter()
    pq.write_table(pa.table({"id": [q["id"] for q in queries], "answer": [o.outputs[0].text for o in outputs],
                             "doc_ids": [[ids[r] for r in found] for found in rows]}), job["output"])
    wall = time.perf_counter() - start
    print(RESULT + json.dumps({
        "load_s": loaded - started, "wall_s": wall, "search_s": searched - start, "generate_s": generated - searched,
        "token_ids": [[t for t in o.outputs[0].token_ids if t not in job["eos_ids"]] for o in outputs],
        "prompt_ids": [list(o.prompt_token_ids) for o in outputs],
        "doc_ids": [[ids[r] for r in found] for found in rows]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
