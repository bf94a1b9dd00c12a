"""What the training commands share: held-out examples, AdamW with warmup, and the checkpoint
a killed run resumes from (``<output>.partial/state.pt``)."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Sequence

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"


class TrainingStopped(RuntimeError):
    """A signal stopped training after a step whose state was saved: ``--resume`` continues there."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """SIGTERM or SIGINT while training: the event is set, and the loop saves its state after the
    step in flight and raises TrainingStopped, so a stopped run loses no step (a kill loses the
    steps since the last checkpoint); a second signal stops at once. Handlers are set only in the
    main thread (elsewhere the event is never set)."""
    import signal
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopped without saving")
        stop.set()
        log.warning("%s: saving the training state after this step, then stopping (again to stop at once)",
                    signal.Signals(signum).name)
    for s in previous:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def split_held_out(examples: Sequence[Any], share: float, seed: int):
    """(train, held out): held-back examples chosen by a seeded hash of their ``id`` (stable under
    reordering)."""
    if share <= 0:
        return list(examples), []

    def key(e):
        return hashlib.sha256(f"{seed}:{e.id}".encode()).hexdigest()
    ranked = sorted(examples, key=key)
    n = max(1, round(share * len(ranked))) if len(ranked) > 1 else 0
    held = {e.id for e in ranked[:n]}
    return [e for e in examples if e.id not in held], [e for e in examples if e.id in held]


def adamw_with_warmup(groups: list[dict], warmup_ratio: float, total_steps: int):
    """AdamW (weight decay 0.01) over parameter groups, linear warmup then linear decay to 0."""
    import torch
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    warmup = max(1, int(warmup_ratio * total_steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total_steps - s) / max(1, total_steps - warmup)))
    return optimizer, schedule


def partial_dir(out_dir: str | Path) -> Path:
    """Where a training run keeps its last checkpoint (``<output>.partial``) until it finishes."""
    return Path(str(out_dir).rstrip("/") + ".partial")


def save_state(state_dir: Path, identity: str, model, optimizer, schedule, generator, rng, order, step: int,
               best: dict, best_weights, report) -> None:
    """The whole training state, written to a temporary file and renamed (a kill leaves the last one).
    ``model`` is a module, or the state dict of its trained part (a LoRA run saves only its adapter)."""
    import torch
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (STATE_FILE + ".tmp")
    weights = model if isinstance(model, dict) else model.state_dict()
    torch.save({"identity": identity, "step": step, "model": weights, "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "generator": generator.get_state(), "rng": rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(), "order": list(order), "best": dict(best),
                "best_weights": best_weights, "report": asdict(report)}, tmp)
    tmp.replace(state_dir / STATE_FILE)


def load_state(state_dir: Path, identity: str) -> dict | None:
    """The saved state of a run with the same identity; a different run's state is an error."""
    import torch
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if state.get("identity") != identity:
        raise ValueError(f"{state_dir} holds the checkpoint of a training run with other settings or data: "
                         "delete it, or rerun with the settings it was made with")
    return state
