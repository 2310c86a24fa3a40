"""Hang diagnosis from pardiag's own records, for any backend.

When a collective times out, the ranks that reached it raise (gloo: "Timed out
waiting ... for recv"; NCCL: the watchdog's "collective operation timeout") and the
rank that never arrived is usually still blocked elsewhere or killed by the launcher.
Each rank's meta.json records how it ended (the exception and the step it was in)
and steps.jsonl the last step it finished, which is enough to say who waited, where,
and who never came. Only collective evidence makes a verdict (`collective_failure`): a
DataLoader, an HTTP client or a socket that times out ends the job too, but no rank waited
for another in a collective. NCCL's own logs give more (sequence numbers, op types): see
nccl.findings.hang_diagnosis; this works without them. The flight recorder's dumps
(analyzers/flight_recorder.py) give the most: the collective the ranks disagree on and
who never entered it; `with_flight_recorder` merges them into the verdict.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from pardiag.analysis_blocks import FlightCall, FlightRecord, Hang, HangLate, HangWait
from pardiag.step_records import StepRecord

# Collective evidence only: the wording of c10d's backends when a collective times out or
# fails, never a bare "timed out" (a DataLoader, an HTTP client or a socket of the user's
# own times out too, and that is no collective hang).
COLLECTIVE_FAILURE = re.compile(
    r"Watchdog caught collective operation timeout"  # ProcessGroupNCCL's watchdog
    r"|WorkNCCL\(SeqNum="  # the NCCL work item that timed out
    r"|Timed out waiting \d+\s*ms for (?:recv|send) operation"  # gloo's unbound buffers
    r"|gloo/transport/\w+/pair\.cc:\d+\] (?:Connection closed by peer|Read error|Write error|Timed out)"  # a gloo peer gone
    r"|failed to pass monitoredBarrier"  # torch.distributed.monitored_barrier
    r"|NCCL error in:|\bnccl(?:System|Internal|Remote|UnhandledCuda|InvalidUsage|InvalidArgument)Error\b"
    r"|NCCL operations have failed or timed out"  # TORCH_NCCL_ASYNC_ERROR_HANDLING's abort
    r"|NCCL communicator was aborted"
    r"|flight recorder",
    re.IGNORECASE,
)
# torch.distributed.DistBackendError: what c10d raises for a failed or timed-out collective
# (DistStoreError and DistNetworkError are the rendezvous store's, not a collective's)
COLLECTIVE_ERROR_TYPES = frozenset({"DistBackendError"})
_WAIT_MS = re.compile(r"(?:waiting|Timeout\(ms\)=|monitoredBarrier in)\s*(\d+)\s*ms|Timeout\(ms\)=(\d+)", re.IGNORECASE)
_OP = re.compile(r"OpType=(\w+)|for (recv|send) operation|(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier)", re.IGNORECASE)

NEXT_STEPS = [
    "py-spy dump --pid <pid of the late rank> (where its Python is blocked)",
    "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives raise at once instead of hanging",
    "the flight recorder's dumps in the run's flight/ folder (NCCL's watchdog writes them on a timeout, pardiag "
    "when a rank fails): pardiag analyze reads them",
]


def collective_failure(exit_record: Mapping[str, Any]) -> bool:
    """Whether a rank's exit record says it failed inside a collective: an exception whose
    type is c10d's backend error or whose message is a backend's collective timeout or
    error (see COLLECTIVE_FAILURE)."""
    if exit_record.get("status") != "exception":
        return False
    return (str(exit_record.get("type") or "") in COLLECTIVE_ERROR_TYPES
            or bool(COLLECTIVE_FAILURE.search(str(exit_record.get("message", "")))))


def _op(message: str) -> str | None:
    m = _OP.search(message)
    if not m:
        return None
    return next(g for g in m.groups() if g).lower()


def diagnose(
    exits: Mapping[int, Mapping[str, Any]],
    last_steps: Mapping[int, int | None],
    world_size: int,
) -> Hang | None:
    """`exits`: rank -> meta.json's `exit` record; `last_steps`: rank -> last finished
    step (None: none). Returns None unless some rank failed in a collective."""
    stuck = {r: e for r, e in exits.items() if collective_failure(e)}
    if not stuck:
        return None
    step = min(int(e.get("step") or 0) for e in stuck.values())
    waited: list[HangWait] = []
    for r, e in sorted(stuck.items()):
        msg = str(e.get("message", ""))
        ms = _WAIT_MS.search(msg)
        waited.append(HangWait(
            rank=r,
            step=e.get("step"),
            op=_op(msg),
            timeout_ms=int(next(g for g in ms.groups() if g)) if ms else None,
            message=msg[:300],
        ))
    late = []
    for r in range(world_size):
        if r in stuck:
            continue
        last = last_steps.get(r)
        ex = exits.get(r) or {}
        if last is None or last < step:
            late.append(HangLate(
                rank=r,
                last_step=last,
                ended=ex.get("status") or "no record",
                reason="never reached the collective"
                + (f": its last finished step is {last}" if last is not None else ": it finished no step")
                + ("" if ex.get("status") not in ("running", None) else "; it was killed or is still running"),
            ))
    ops = sorted({w.op for w in waited if w.op})
    summary = (
        f"rank(s) {', '.join(str(w.rank) for w in waited)} timed out in a collective"
        + (f" ({', '.join(ops)})" if ops else "")
        + f" during step {step}"
    )
    if late:
        summary += f"; rank(s) {', '.join(str(x.rank) for x in late)} never arrived"
    else:
        summary += "; every rank reached that step: a mismatch of collectives or a network fault"
    return Hang(source="pardiag", step=step, summary=summary, waited=waited, late=late, collect_next=list(NEXT_STEPS))


def last_finished_steps(step_records: Mapping[int, Sequence[StepRecord]]) -> dict[int, int | None]:
    """rank -> the highest step number in its steps.jsonl (every step, counted or not)."""
    return {r: (max(x.step for x in recs) if recs else None) for r, recs in step_records.items()}


# --------------------------------------------------------------------------- flight recorder


def _call_words(c: FlightCall) -> str:
    sizes = f" of {c.input_sizes}" if c.input_sizes else ""
    dtypes = f" {'/'.join(sorted(set(c.input_dtypes)))}" if c.input_dtypes else ""
    return f"{c.op}{sizes}{dtypes}"


def flight_words(f: FlightRecord) -> str:
    """The dumps' verdict in one sentence: the first collective the ranks disagree on, who
    differs (or never entered it), and where the culprits called it from."""
    for g in f.groups:
        m = g.first_mismatch
        if m is None:
            continue
        head = f"flight recorder: collective #{m.seq} of process group {g.process_group}"
        if m.match_state == "MISSING_RANKS":
            text = (f"{head} ({_call_words(m.expected)} on rank {m.reference_rank}): rank(s) "
                    f"{', '.join(map(str, m.culprit_ranks))} never entered it")
        else:
            found = "; ".join(f"rank {c.rank} called {_call_words(c)}" for c in m.found)
            text = (f"{head} is {m.match_state}: rank {m.reference_rank} called {_call_words(m.expected)}, "
                    f"{found}")
        where = [c for c in (m.expected, *m.found) if c.user_frame]
        if where:
            text += " (" + ", ".join(f"rank {c.rank} at {c.user_frame}" for c in where) + ")"
        return text
    return f"flight recorder: {f.summary}"


def with_flight_recorder(hang: Hang | None, flight: FlightRecord | None) -> Hang | None:
    """One verdict from the exits (or the NCCL logs) and the flight-recorder dumps. The dumps
    decide it when they name a culprit (`source: "flight_recorder"`, their sentence first,
    the other diagnosis after it); their ranks that never entered the collective join `late`.
    Dumps that show nothing wrong only ride along in `flight`; without another diagnosis
    they make no hang."""
    if flight is None:
        return replace(hang, sources=hang.sources or [hang.source]) if hang else None
    culprit = next((g for g in flight.groups if g.first_mismatch), None)
    if culprit is None:
        if hang is None:
            return None
        return replace(hang, flight=flight, sources=[*(hang.sources or [hang.source]), "flight_recorder"])
    m = culprit.first_mismatch
    assert m is not None
    said = flight_words(flight)
    known = {x.rank for x in hang.late} if hang else set()
    late = [*(hang.late if hang else []),
            *(HangLate(rank=r, reason=f"never entered collective #{m.seq} ({m.expected.op}) of process group "
                                      f"{culprit.process_group} (flight recorder)")
              for r in culprit.never_arrived if r not in known)]
    if hang is None:
        waited = [HangWait(rank=x.rank, op=x.last_entered.op, timeout_ms=x.last_entered.timeout_ms,
                           message=f"collective #{x.last_entered.seq} {_call_words(x.last_entered)} not completed")
                  for x in culprit.last if x.last_entered and x.last_entered.state != "completed"]
        return Hang(source="flight_recorder", summary=said, waited=waited, late=late, flight=flight,
                    sources=["flight_recorder"], collect_next=list(NEXT_STEPS[:2]))
    return replace(hang, source="flight_recorder", summary=f"{said}. {hang.summary}", late=late, flight=flight,
                   sources=[*(hang.sources or [hang.source]), "flight_recorder"])


def flight_recorder_verdict(hang: Hang | None, folder: Path, world_size: int | None) -> tuple[Hang | None, list[str]]:
    """`with_flight_recorder` on the run's `flight/` folder; the dumps' notes (files or ranks
    left out) come back to be shown. Never raises: a failure is one note."""
    from pardiag.analyzers.flight_recorder import analyze_flight_dir

    try:
        flight = analyze_flight_dir(folder, world_size or None)
    except Exception as e:  # the dumps must not take the analysis down
        return with_flight_recorder(hang, None), [f"flight recorder unreadable: {type(e).__name__}: {e}"]
    return with_flight_recorder(hang, flight), [f"flight recorder: {n}" for n in (flight.notes if flight else ())]
