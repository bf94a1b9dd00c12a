"""One run of a job in its output folder: the call every job that writes a folder goes through.

``answer`` (batch and streaming), ``extract-triplets``, ``build-index``, ``build-datastore`` and
the training commands each open their run with ``job_run`` and do their work inside it, so the
rules of ``RunFolder`` (jobio/run_folder.py) hold for all of them the same way, on local and
object-store paths alike: an earlier run is refused unless ``resume`` or ``overwrite``; a resume
is checked against the earlier run's identity and inputs before anything is touched; the folder
is leased to this run; an overwrite is a transaction; and the identity and inputs a later
``--resume`` is checked against are written before the first result.

Example usage::

    with job_run("out/", ANSWER, identity, resume=True, inputs=inputs) as run:
        ...  # write results under run.token, then the manifest
        run.judge(run.folder.reconcile(inputs), max_failure_fraction=0.5)
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Iterator

from specrag.jobio.files import join, write_text
from specrag.jobio.lease import Lease
from specrag.jobio.run_folder import IDENTITY_FILE, INPUTS_FILE, RunFolder, RunLayout, input_contents


@dataclass(frozen=True)
class JobRun:
    """The run that ``job_run`` holds: its folder's rules, its lease, and (``--grow-from``) the
    earlier input its results answered."""
    folder: RunFolder
    lease: Lease
    grown: dict | None = None

    @property
    def token(self) -> str:
        """What every shard commit checks: the folder is still leased to this run."""
        return self.lease.token

    @property
    def took_over(self) -> dict | None:
        """The killed run's lease this run took over, for the manifest (None: none)."""
        return self.lease.took_over

    def judge(self, reconciliation: dict, max_failure_fraction: float) -> None:
        """RunFailed when rows were lost or too many are dead letters; an overwritten run comes back."""
        self.folder.judge(reconciliation, max_failure_fraction)


@contextlib.contextmanager
def job_run(output: str, layout: RunLayout, identity: dict[str, Any] | None = None, *, resume: bool = False,
            overwrite: bool = False, inputs: dict | None = None, grow_from: dict | None = None,
            grow_from_name: str = "", recorded_inputs: list | None = None) -> Iterator[JobRun]:
    """Hold ``output`` for one run of a ``layout`` job (see the module's docstring).

    ``identity``: what the run's results depend on (None: a job without resume, such as an
    index build); ``inputs``: the input files' fingerprints (``dataset_fingerprint``), checked on
    resume and recorded, where ``grow_from`` (the fingerprints of an earlier, smaller input) may
    stand for the earlier run's; ``recorded_inputs``: what to record instead, for a source that is
    not files (a stream)."""
    folder = RunFolder(output, layout)
    grown = None
    if resume:  # before the folder is touched: a refused resume leaves it as it was
        if identity is not None:
            folder.check_resumable(identity)
        if inputs is not None:
            grown = folder.check_inputs(inputs, grow_from, grow_from_name)
    with folder.writing(resume=resume, overwrite=overwrite) as lease:
        # written before the run: a killed run can only be resumed with the same identity and inputs
        if identity is not None:
            write_text(join(output, IDENTITY_FILE), json.dumps(identity, indent=2, sort_keys=True, default=str))
        record = recorded_inputs if recorded_inputs is not None else (
            input_contents(inputs) if inputs is not None else None)
        if record is not None:
            write_text(join(output, INPUTS_FILE), json.dumps(record, indent=2))
        yield JobRun(folder, lease, grown)


__all__ = ["JobRun", "job_run"]
