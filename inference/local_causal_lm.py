"""The local backend's causal LM (SmolLM2, Gemma 3, Qwen2.5): generate, score, next token, fused decode.

Generation is our own KV-cached decode loop rather than ``model.generate``: it gives
per-row stop strings, per-row seeds for sampling, the log-probability of every chosen token
under the unmodified distribution, and drops finished rows from the batch so one long
answer does not keep short ones computing. Prompts are left-padded with explicit position
ids, so a batched greedy run matches the unbatched one.
"""
from __future__ import annotations

import copy
import threading
import time

import numpy as np

from specrag.inference.kv_cache import can_stack, cast_cache, stack_caches
from specrag.inference.local_base import (LocalModelConfig, SCORE_LOGITS_BUDGET, prompt_token_ids,
                                          set_torch_threads, left_pad, choose_token, first_stop)
from specrag.inference.models import materialise, model_spec
from specrag.inference.types import (FusedDecodeRequest, GenerateRequest, Generation, NextToken,
                                     NextTokenRequest, ScoreRequest, Scored)


class LocalCausalLM:
    """generate() and score() for one causal LM (SmolLM2 or Gemma 3)."""

    def __init__(self, config: LocalModelConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        spec = model_spec(config.model)
        if spec.kind != "causal-lm":
            raise ValueError(f"{config.model} is not a causal LM")
        set_torch_threads(config.num_threads)
        path = materialise(config.model)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=config.decode_torch_dtype())
        self._setup(config, AutoTokenizer.from_pretrained(path), config.quantise(model.eval()),
                    chat=spec.chat is not False)

    @classmethod
    def from_model(cls, model, tokenizer, config: LocalModelConfig) -> "LocalCausalLM":
        """The engine over a model already built, not loaded by name: no registry, no files
        (benchmarks/gpu builds models of the papers' shapes with random weights). No chat template."""
        self = cls.__new__(cls)
        self._setup(config, tokenizer, model.eval(), chat=False)
        return self

    def _setup(self, config: LocalModelConfig, tokenizer, model, chat: bool) -> None:
        import torch
        self.name = config.model
        self.config = config
        self.tokenizer = tokenizer
        self.device = torch.device(config.device)
        # decode steps run in decode_model, every other forward in model: one object but under
        # --dtype bfloat16-prefill, where model is a bfloat16 copy of the float32 decode_model
        self.decode_model = model.to(self.device)
        self.model = self.decode_model
        if config.torch_dtype() != config.decode_torch_dtype():
            self.model = copy.deepcopy(self.decode_model).to(config.torch_dtype())
        self._decode_dtype = config.decode_torch_dtype() if self.model is not self.decode_model else None
        self.instruct = chat and bool(self.tokenizer.chat_template)
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._lock = threading.Lock()
        self._stackable: bool | None = None  # learnt from the first prefilled cache
        self.prefix_cache = None
        if config.prefix_cache_mb > 0 and "sliding_attention" not in (getattr(self.model.config, "layer_types", None)
                                                                      or ()):
            from specrag.inference.prefix_cache import PrefixKVCache
            self.prefix_cache = PrefixKVCache(config.prefix_block_tokens, config.prefix_cache_mb << 20)
        # where generation time goes (benchmarks read it): prefill is compute-bound on CPU,
        # decoding memory-bound — only the latter gains from batching
        self.stats = {"prefill_s": 0.0, "decode_s": 0.0, "prefill_tokens": 0, "decode_steps": 0,
                      "decode_rows": 0, "calls": 0}

    # -- tokenisation -------------------------------------------------------------------
    def prompt_ids(self, prompt: str, chat: bool) -> list[int]:
        ids = prompt_token_ids(self.tokenizer, prompt, chat and self.instruct)
        if len(ids) > self.config.max_prompt_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens, over max_prompt_tokens="
                             f"{self.config.max_prompt_tokens} of {self.name}")
        return ids

    # -- operations ---------------------------------------------------------------------
    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(list(i), skip_special_tokens=True) for i in ids]

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]:
        """Batch-invariant rows run alone (prefill and decode); the rest share one batch."""
        alone = [i for i, r in enumerate(requests) if r.batch_invariant]
        if not alone or (len(requests) == 1):
            with self._lock:
                return self._generate(requests)
        out: list[Generation | None] = [None] * len(requests)
        together = [i for i in range(len(requests)) if i not in set(alone)]
        with self._lock:
            for i in alone:
                out[i] = self._generate([requests[i]])[0]
            if together:
                for i, g in zip(together, self._generate([requests[i] for i in together])):
                    out[i] = g
        return out

    def _prefill(self, prompts: list[list[int]], extra_capacity: int, head_lens: list[int] | None = None):
        """KV cache, attention mask, last positions, next-token logits and, per row, the leading
        tokens taken from the prefix cache (0 without one) for a batch.

        Rows are prefilled one at a time and stacked (see kv_cache); models whose cache
        cannot be stacked (sliding-window layers) fall back to one left-padded forward. The
        cache comes back in the decode steps' dtype (bfloat16-prefill: prefilled in bfloat16,
        decoded in float32). ``head_lens``: where each row's prompt ends and its continuation ids begin (the
        prefix cache's segments); None: all prompt.
        """
        import torch
        from transformers.cache_utils import DynamicCache
        if self.prefix_cache is not None:  # segmented prefill, reusing cached segments
            caches, logits, reused = [], [], []
            for row, ids in enumerate(prompts):
                head = len(ids) if head_lens is None else head_lens[row]
                cache, last_logits, _, from_cache = self.prefix_cache.prefill(self.model, ids[:head], ids[head:])
                caches.append(cache)
                logits.append(last_logits)
                reused.append(from_cache)
            ids, mask = left_pad(prompts, self.pad_id, self.device)
            last_pos = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
            return (stack_caches(caches, extra_capacity, self._decode_dtype), mask, last_pos, torch.cat(logits),
                    reused)
        if len(prompts) > 1 and self._stackable is not False:
            caches, logits = [], []
            for ids in prompts:
                cache = DynamicCache()
                res = self.model(input_ids=torch.tensor([ids], device=self.device), past_key_values=cache, use_cache=True,
                                 logits_to_keep=1)  # the vocab projection of 1 position, not all
                if self._stackable is None:
                    self._stackable = can_stack(res.past_key_values)
                    if not self._stackable:
                        break
                caches.append(res.past_key_values)
                logits.append(res.logits[:, -1, :])
            if self._stackable:
                ids, mask = left_pad(prompts, self.pad_id, self.device)
                last_pos = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
                return (stack_caches(caches, extra_capacity, self._decode_dtype), mask, last_pos, torch.cat(logits),
                        [0] * len(prompts))
        ids, mask = left_pad(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        res = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        past = res.past_key_values if self._decode_dtype is None else cast_cache(res.past_key_values,
                                                                                  self._decode_dtype)
        return past, mask, positions[:, -1], res.logits[:, -1, :], [0] * len(prompts)

    def _step(self, past, mask, last_pos, keep: list[int], next_tokens: list[int]):
        """One decoding step for the batch rows in ``keep`` (finished rows leave the KV cache
        first), each fed its next token; returns the new cache, mask, positions and logits."""
        import torch
        if len(keep) < mask.shape[0]:
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            past.batch_select_indices(index)
            mask, last_pos = mask[index], last_pos[index]
        mask = torch.cat([mask, mask.new_ones((len(keep), 1))], dim=1)
        last_pos = last_pos + 1
        res = self.decode_model(input_ids=torch.tensor(next_tokens, device=self.device).unsqueeze(1), attention_mask=mask,
                         position_ids=last_pos.unsqueeze(1), past_key_values=past, use_cache=True)
        return res.past_key_values, mask, last_pos, res.logits[:, -1, :]

    def _generate(self, requests: list[GenerateRequest]) -> list[Generation]:
        import torch
        heads = [self.prompt_ids(r.prompt, r.chat) for r in requests]
        prompts = [h + list(r.continuation_ids) for h, r in zip(heads, requests)]
        over = [len(p) for p in prompts if len(p) > self.config.max_prompt_tokens]
        if over:
            raise ValueError(f"prompt has {over[0]} tokens with its continuation, over max_prompt_tokens="
                             f"{self.config.max_prompt_tokens} of {self.name}")
        n = len(requests)
        generators = [torch.Generator().manual_seed(r.seed) if r.temperature > 0 else None
                      for r in requests]
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lp: list[list[float]] = [[] for _ in range(n)]
        texts: list[str | None] = [None] * n  # set when a stop string cuts a row; else decoded at the end
        finish = ["length"] * n
        active = list(range(n))  # rows of the current batch -> request index
        started = time.perf_counter()
        with torch.inference_mode():
            past, mask, last_pos, logits, reused = self._prefill(prompts, max(r.max_new_tokens for r in requests),
                                                                 [len(h) for h in heads])
            prefilled = time.perf_counter()
            while active:
                self.stats["decode_steps"] += 1
                self.stats["decode_rows"] += len(active)
                logp = torch.log_softmax(logits.float(), dim=-1)
                greedy = logp.argmax(-1).tolist()  # one call for the whole batch
                next_tokens = [greedy[row] if requests[i].temperature <= 0
                               else choose_token(logp[row].cpu(), requests[i], generators[i])
                               for row, i in enumerate(active)]
                chosen_lp = logp.gather(-1, torch.tensor(next_tokens, device=self.device).unsqueeze(-1)).squeeze(-1).tolist()
                for row, i in enumerate(active):
                    out_ids[i].append(next_tokens[row])
                    out_lp[i].append(chosen_lp[row])
                keep = []
                for row, i in enumerate(active):
                    r = requests[i]
                    if next_tokens[row] in self.eos_ids:
                        out_ids[i].pop(); out_lp[i].pop()  # EOS is not part of the text
                        finish[i] = "stop"
                        continue
                    if r.stop:  # decoding every step is only needed to find stop strings
                        text = self.tokenizer.decode(out_ids[i], skip_special_tokens=True)
                        cut = first_stop(text, r.stop)
                        if cut is not None:
                            texts[i] = text[:cut]
                            finish[i] = "stop"
                            continue
                    if len(out_ids[i]) >= r.max_new_tokens:
                        continue
                    keep.append(row)
                if not keep:
                    break
                next_tokens = [next_tokens[k] for k in keep]
                active = [active[k] for k in keep]
                past, mask, last_pos, logits = self._step(past, mask, last_pos, keep, next_tokens)
        self.stats["calls"] += 1
        self.stats["prefill_s"] += prefilled - started
        self.stats["decode_s"] += time.perf_counter() - prefilled
        self.stats["prefill_tokens"] += sum(len(p) for p in prompts)
        texts = [t if t is not None else self.tokenizer.decode(ids, skip_special_tokens=True)
                 for t, ids in zip(texts, out_ids)]
        return [Generation(texts[i], out_ids[i], out_lp[i], len(prompts[i]), finish[i], reused[i]) for i in range(n)]

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        contrastive = [i for i, r in enumerate(requests) if r.contrast_prompt is not None]
        with self._lock:
            if not contrastive:
                return self._score(requests)
            out: list[Scored | None] = [None] * len(requests)
            plain = [i for i in range(len(requests)) if i not in set(contrastive)]
            for i, scored in zip(plain, self._score([requests[i] for i in plain]) if plain else []):
                out[i] = scored
            for i, scored in zip(contrastive, self._contrastive_score([requests[i] for i in contrastive])):
                out[i] = scored
            return out

    def fused_decode(self, requests: list[FusedDecodeRequest]) -> list[Generation]:
        with self._lock:
            return self._fused_decode(requests)

    def _fused_decode(self, requests: list[FusedDecodeRequest]) -> list[Generation]:
        """All streams of all requests in one batch, each with its own KV cache; per step and
        request one weighted sum of the streams' log-probabilities, one argmax, and that token
        appended to every stream of the request. Finished requests leave the batch."""
        import torch
        rows, owner, weight = [], [], []
        for i, r in enumerate(requests):
            for prompt, w in r.streams():
                ids = self.prompt_ids(prompt, r.chat)
                rows.append(ids)
                owner.append(i)
                weight.append(w)
        n = len(requests)
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lp: list[list[float]] = [[] for _ in range(n)]
        texts: list[str | None] = [None] * n
        finish = ["length"] * n
        active = list(range(len(rows)))  # batch row -> stream index
        started = time.perf_counter()
        with torch.inference_mode():
            past, mask, last_pos, logits, _ = self._prefill(rows, max(r.max_new_tokens for r in requests))
            prefilled = time.perf_counter()
            while active:
                self.stats["decode_steps"] += 1
                self.stats["decode_rows"] += len(active)
                logp = torch.log_softmax(logits.float(), dim=-1)
                w = torch.tensor([weight[s] for s in active], dtype=logp.dtype, device=logp.device)
                req_of_row = [owner[s] for s in active]
                present = sorted(set(req_of_row))
                index = torch.tensor([present.index(q) for q in req_of_row], device=logp.device)
                fused = torch.zeros((len(present), logp.shape[1]), dtype=logp.dtype, device=logp.device)
                fused.index_add_(0, index, logp * w.unsqueeze(1))  # sum_z w_z log P(v | z, y_<t)
                best = fused.argmax(-1)
                best_lp = fused.gather(-1, best.unsqueeze(-1)).squeeze(-1).tolist()
                best = best.tolist()
                done = set()
                for k, q in enumerate(present):
                    r = requests[q]
                    if best[k] in self.eos_ids:
                        finish[q] = "stop"
                        done.add(q)
                        continue
                    out_ids[q].append(best[k])
                    out_lp[q].append(best_lp[k])
                    if r.stop:
                        text = self.tokenizer.decode(out_ids[q], skip_special_tokens=True)
                        cut = first_stop(text, r.stop)
                        if cut is not None:
                            texts[q], finish[q] = text[:cut], "stop"
                            done.add(q)
                            continue
                    if len(out_ids[q]) >= r.max_new_tokens:
                        done.add(q)
                keep = [row for row, q in enumerate(req_of_row) if q not in done]
                if not keep:
                    break
                next_tokens = [best[present.index(req_of_row[row])] for row in keep]
                active = [active[row] for row in keep]
                past, mask, last_pos, logits = self._step(past, mask, last_pos, keep, next_tokens)
        self.stats["calls"] += 1
        self.stats["prefill_s"] += prefilled - started
        self.stats["decode_s"] += time.perf_counter() - prefilled
        self.stats["prefill_tokens"] += sum(len(p) for p in rows)
        prompt_tokens = [sum(len(rows[s]) for s in range(len(rows)) if owner[s] == i) for i in range(n)]
        texts = [t if t is not None else self.tokenizer.decode(ids, skip_special_tokens=True)
                 for t, ids in zip(texts, out_ids)]
        return [Generation(texts[i], out_ids[i], out_lp[i], prompt_tokens[i], finish[i]) for i in range(n)]

    def _contrastive_score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """Per continuation token, log p~ = log softmax((1+a)·l_ctx − a·l_base) at the gold token
        (log-probabilities stand in for logits: softmax ignores a per-position constant). Each
        distinct contrast prompt (with its continuation) is computed once per call."""
        import torch
        conts = [self.tokenizer(r.continuation, add_special_tokens=False)["input_ids"] for r in requests]
        if any(not c for c in conts):
            raise ValueError("score: empty continuation")
        ctx_rows = [self.prompt_ids(r.prompt, r.chat) + c for r, c in zip(requests, conts)]
        base_key = [(r.contrast_prompt, r.chat, tuple(c)) for r, c in zip(requests, conts)]
        distinct = list(dict.fromkeys(base_key))
        base_rows = [self.prompt_ids(p, chat) + list(c) for p, chat, c in distinct]
        for row in ctx_rows + base_rows:
            if len(row) > self.config.max_prompt_tokens:
                raise ValueError(f"score: prompt + continuation have {len(row)} tokens, over "
                                 f"max_prompt_tokens={self.config.max_prompt_tokens} of {self.name}")
        base = self._continuation_logprobs(base_rows, [len(c) for _, _, c in distinct])
        ctx = self._continuation_logprobs(ctx_rows, [len(c) for c in conts])
        out = []
        for r, c, key, row, lp_ctx in zip(requests, conts, base_key, ctx_rows, ctx):
            lp_base = base[distinct.index(key)]
            mixed = torch.log_softmax((1 + r.alpha) * lp_ctx - r.alpha * lp_base, dim=-1)
            target = torch.tensor(c).unsqueeze(-1)
            out.append(Scored([float(x) for x in mixed.gather(-1, target).squeeze(-1).tolist()],
                              len(row) - len(c), self.tokenizer.convert_ids_to_tokens(c)))
        return out

    def _continuation_logprobs(self, rows: list[list[int]], clens: list[int]) -> list:
        """Full-vocabulary log-probabilities [clen, vocab] at each continuation position of
        each row (the last clen tokens), in sub-batches under the logits budget."""
        import torch
        vocab = self.model.config.get_text_config().vocab_size
        out: list = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        chunk: list[int] = []

        def run(idx):
            ids, mask = left_pad([rows[i] for i in idx], self.pad_id, self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            keep = max(clens[i] for i in idx) + 1
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                    logits_to_keep=keep).logits
            for b, i in enumerate(idx):
                out[i] = torch.log_softmax(logits[b, keep - clens[i] - 1: keep - 1].float(), dim=-1).cpu()

        for i in order:
            if chunk and (len(chunk) + 1) * (max(clens[j] for j in chunk + [i]) + 1) * vocab * 4 > SCORE_LOGITS_BUDGET:
                run(chunk)
                chunk = []
            chunk.append(i)
        if chunk:
            run(chunk)
        return out

    def next_token(self, requests: list[NextTokenRequest]) -> list[NextToken]:
        """Each row alone (batch-invariant): one forward over its whole prefix."""
        import torch
        out = []
        with self._lock, torch.inference_mode():
            for r in requests:
                head = self.prompt_ids(r.prompt, r.chat)
                ids = head + list(r.continuation_ids)
                if self.prefix_cache is not None:  # the prompt and full blocks come from earlier steps
                    _, last_logits, last_hidden, _ = self.prefix_cache.prefill(self.model, head, r.continuation_ids,
                                                                            hidden=True)
                else:
                    res = self.model(input_ids=torch.tensor([ids], device=self.device), output_hidden_states=True,
                                     logits_to_keep=1, use_cache=False)
                    last_logits, last_hidden = res.logits[:, -1], res.hidden_states[-1][0, -1]
                hidden = last_hidden.float().cpu().numpy()
                logprobs = torch.log_softmax(last_logits[0].float(), dim=-1).cpu().numpy()
                out.append(NextToken(hidden.astype(np.float32), logprobs.astype(np.float32), len(ids)))
        return out

    def token_states(self, texts: list[str], max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Teacher-forced (hidden state at t, token t+1) pairs of each text: a KNN-LM datastore's
        keys and values. Texts are cut to ``max_tokens`` tokens."""
        import torch
        out = []
        with self._lock, torch.inference_mode():
            for text in texts:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
                if len(ids) < 2:
                    out.append((np.zeros((0, self.model.config.hidden_size), np.float32), np.zeros(0, np.int64)))
                    continue
                res = self.model(input_ids=torch.tensor([ids], device=self.device), output_hidden_states=True,
                                 use_cache=False, logits_to_keep=1)
                keys = res.hidden_states[-1][0, :-1].float().cpu().numpy().astype(np.float32)
                out.append((keys, np.asarray(ids[1:], dtype=np.int64)))
        return out

    def _score(self, requests: list[ScoreRequest]) -> list[Scored]:
        rows, spans, targets = [], [], []
        # Closed-set scoring asks for several one-token options after one prompt ("A".."D",
        # "true"/"false"): the next-token distribution at the prompt's end answers them all,
        # so such requests share one row (the prompt is encoded once, not once per option).
        shared: dict[tuple[int, ...], int] = {}
        for k, r in enumerate(requests):
            p = self.prompt_ids(r.prompt, chat=r.chat)
            pieces = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in r.segments or (r.continuation,)]
            c = [i for piece in pieces for i in piece]
            if not c:
                raise ValueError("score: empty continuation")
            if len(p) + len(c) > self.config.max_prompt_tokens:
                raise ValueError(f"score: prompt + continuation have {len(p) + len(c)} tokens, over "
                                 f"max_prompt_tokens={self.config.max_prompt_tokens} of {self.name}")
            if len(c) == 1 and not r.segments:
                row = shared.get(tuple(p))
                if row is not None:
                    targets[row].append((k, c[0]))
                    continue
                shared[tuple(p)] = len(rows)
                targets.append([(k, c[0])])
            else:
                targets.append([(k, None)])
            rows.append(p + c)
            spans.append((len(p), len(c), [len(piece) for piece in pieces] if r.segments else []))
        # The vocabulary projection is the memory: [rows, positions, vocab] floats (Gemma 3:
        # 262k entries, 1 MB per position). Only the continuation's positions are projected
        # (logits_to_keep, continuations are right-aligned), in sub-batches under a budget.
        vocab = self.model.config.get_text_config().vocab_size
        per_row = lambda i: (spans[i][1] + 1) * vocab * 4  # noqa: E731
        out: list[Scored] = [None] * len(requests)  # type: ignore[list-item]
        chunk: list[int] = []
        for i in sorted(range(len(rows)), key=lambda i: len(rows[i])):  # similar lengths pad less
            if chunk and (len(chunk) + 1) * max(per_row(j) for j in chunk + [i]) > SCORE_LOGITS_BUDGET:
                self._score_rows(rows, spans, targets, chunk, out)
                chunk = []
            chunk.append(i)
        if chunk:
            self._score_rows(rows, spans, targets, chunk, out)
        return out

    def _score_rows(self, rows, spans, targets, idx: list[int], out: list) -> None:
        """Score rows ``idx``; ``targets[row]`` lists the requests a row answers: (request, None)
        scores the row's own continuation, (request, token id) one token after the prompt."""
        import torch
        ids, mask = left_pad([rows[i] for i in idx], self.pad_id, self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(spans[i][1] for i in idx) + 1
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                logits_to_keep=keep).logits  # the last `keep` positions
        width = ids.shape[1]
        for b, i in enumerate(idx):
            plen, clen, seg_lens = spans[i]
            lp_all = torch.log_softmax(logits[b, keep - clen - 1: keep - 1].float(), dim=-1)
            for k, token in targets[i]:
                if token is None:
                    target = ids[b, width - clen:]  # the continuation: the last clen tokens (left padding)
                    lp = lp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
                    out[k] = Scored([float(x) for x in lp.tolist()], plen,
                                    self.tokenizer.convert_ids_to_tokens(target.tolist()), seg_lens)
                else:
                    out[k] = Scored([float(lp_all[0, token])], plen, self.tokenizer.convert_ids_to_tokens([token]), [])
