"""Bare vLLM for benchmarks/peers.py: offline ``LLM.generate`` on the given prompt token ids.

Run by the vLLM venv's Python (``.venv-vllm/bin/python``: vLLM cannot be imported beside
specrag), with the environment ``VllmServer.environment()`` builds; reads a JSON job on stdin
(model folder, dtype, prompts as token ids, sampling settings) and prints one JSON line: the
model load time, the generation wall time and each prompt's generated token ids, after
``RESULT`` (vLLM logs to stdout as well).
"""
import json
import sys
import time

RESULT = "BARE_VLLM_RESULT "


def main() -> int:
    job = json.load(sys.stdin)
    started = time.perf_counter()
    from vllm import LLM, SamplingParams, TokensPrompt
    llm = LLM(model=job["folder"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0,
              enable_prefix_caching=True, generation_config="vllm", max_num_seqs=job["max_num_seqs"])
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], stop=job["stop"],
                            stop_token_ids=job["eos_ids"])
    llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0][:64])], SamplingParams(max_tokens=2),
                 use_tqdm=False)  # first-call set-up out of the timing, as for the other systems
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
    wall = time.perf_counter() - start
    ids = [[t for t in o.outputs[0].token_ids if t not in job["eos_ids"]] for o in outputs]
    print(RESULT + json.dumps({"load_s": loaded - started, "wall_s": wall, "token_ids": ids}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
