"""manifest.json: what a run was and what each collector got, written last.

Several `pardiag run` processes (one per node) may share a run directory: each
leaves its own record under `launchers/`, and each rebuilds the manifest from all
records and all rank files under a lock, so the last one to finish writes a
manifest that covers everyone.
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from pardiag import __version__, rundir
from pardiag.rank_meta import RankMeta
from pardiag.redact import safe_redact


@contextmanager
def locked(run: rundir.RunDir) -> Iterator[None]:
    run.root.mkdir(parents=True, exist_ok=True)
    with open(run.lock, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without locks: records under launchers/ still survive
        try:
            yield
        finally:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            except OSError:
                pass


def _rank_summary(run: rundir.RunDir, rank: int) -> tuple[dict[str, Any], RankMeta | None]:
    info: dict[str, Any] = {"rank": rank}
    meta: RankMeta | None = None
    try:
        meta = rundir.read_meta(run, rank)
    except rundir.RunDirError as e:
        info["meta_error"] = str(e)
    steps = 0
    last = None
    for rec in rundir.iter_steps(run.steps(rank)):
        steps += 1
        last = rec.step
    info["steps"] = steps
    info["last_step"] = last
    trace, complete = run.find_trace(rank)
    info["trace"] = trace.name if trace is not None else None
    info["trace_complete"] = complete
    if meta is not None:
        info["host"] = meta.host
        info["pid"] = meta.pid
        info["exit"] = _redacted_exit(meta.exit.to_dict()) if "exit" in meta.keys else None
        info["profiler"] = meta.profiler.status if meta.profiler else None
        info["errors"] = len(meta.errors)
    return info, meta


def _redacted_exit(ex: dict[str, Any]) -> dict[str, Any]:
    """The exit record as the manifest keeps it: its texts redacted again (meta.json's
    writer redacts them; a file from another writer may not have)."""
    for k in ("message", "traceback"):
        if k in ex:
            ex[k] = safe_redact(ex[k])
    return ex


def _collector_status(
    run: rundir.RunDir,
    ranks: dict[int, dict[str, Any]],
    metas: dict[int, RankMeta],
    world_size: int | None,
    launchers: list[dict[str, Any]],
) -> dict[str, Any]:
    expected = set(range(world_size)) if world_size else set(ranks)
    missing = sorted(expected - set(ranks))
    status: dict[str, Any] = {}

    if not ranks:
        reason = (
            "no training step was seen: the script never finished a torch optimizer step "
            "(call pardiag.step() at the end of each step in loops without one)"
        )
        for name in ("steps", "meta", "profiler"):
            status[name] = {"status": "skipped", "reason": reason}
    else:
        with_steps = [r for r, i in ranks.items() if i["steps"]]
        status["steps"] = _coverage(with_steps, expected, "steps.jsonl")
        status["meta"] = _coverage(list(metas), expected, "meta.json")
        status["profiler"] = _profiler_status({r: m.profiler.to_dict() if m.profiler else {} for r, m in metas.items()},
                                              missing)
    status["missing_ranks"] = missing

    logs = [p for p in run.nccl_dir.glob("*.log") if p.stat().st_size > 0] if run.nccl_dir.is_dir() else []
    backends = {m.backend for m in metas.values() if m.backend}
    user_file = next((l.get("nccl", {}).get("kept_from_user", {}).get("NCCL_DEBUG_FILE") for l in launchers if l.get("nccl")), None)
    if logs:
        status["nccl"] = {"status": "ok", "files": len(logs)}
    elif user_file:
        status["nccl"] = {"status": "skipped", "reason": f"NCCL_DEBUG_FILE was set by the user to {user_file}"}
    elif any("nccl" in str(b) for b in backends):
        status["nccl"] = {"status": "failed", "reason": "backend is NCCL but no NCCL log was written"}
    else:
        which = ", ".join(sorted(str(b) for b in backends)) or "none seen"
        status["nccl"] = {"status": "skipped", "reason": f"no NCCL communicator was created (backend: {which})"}

    dumps = sorted(p.name for p in run.flight_dir.glob("*")) if run.flight_dir.is_dir() else []
    status["flight_recorder"] = (
        {"status": "ok", "dumps": dumps}
        if dumps
        else {"status": "ok", "dumps": [], "reason": "armed; no dump (no collective timed out)"}
    )
    telemetry = [l.get("telemetry") for l in launchers if l.get("telemetry")]
    status["telemetry"] = telemetry[0] if telemetry else {"status": "skipped", "reason": "not recorded"}

    measured = [l["factors"] for l in launchers if isinstance(l.get("factors"), dict)]
    if measured:  # the node that measured (the lowest rank's) speaks for the run
        status["factors"] = next((m for m in measured if m.get("status") in ("ok", "partial", "failed")), measured[0])

    boot = sorted(run.bootstrap_errors_dir.glob("*.txt")) if run.bootstrap_errors_dir.is_dir() else []
    if boot:
        status["bootstrap"] = {
            "status": "failed",
            "reason": boot[0].read_text(errors="replace").strip().splitlines()[0][:300],
            "files": [p.name for p in boot],
        }
    return status


def _profiler_status(prof: dict[int, dict[str, Any]], missing: list[int]) -> dict[str, Any]:
    """ok: every profiled rank has a complete trace; partial: some trace; failed: none.
    Ranks left out on purpose (--ranks, --no-profile) do not count."""
    chosen = {r: p for r, p in prof.items() if not _left_out(p)}
    with_trace = sorted(r for r, p in chosen.items() if p.get("status") in ("ok", "partial"))
    problems = {str(r): f"{p.get('status')}: {p.get('reason')}" for r, p in chosen.items() if p.get("status") != "ok"}
    if not chosen:
        st = "skipped"
    elif not problems and not missing:
        st = "ok"
    else:
        st = "partial" if with_trace else "failed"
    reason = "; ".join(f"rank {r}: {v}" for r, v in sorted(problems.items(), key=lambda kv: int(kv[0])))
    if not chosen and prof:
        reason = next(iter(prof.values())).get("reason") or ""
    return {
        "status": st,
        "ranks_with_trace": with_trace,
        "ranks_selected": sorted(chosen),
        "problems": problems,
        "reason": reason or None,
    }


def _left_out(p: dict[str, Any]) -> bool:
    reason = str(p.get("reason") or "")
    return p.get("status") == "skipped" and ("--ranks" in reason or reason == "profiling is off")


def _coverage(have: list[int], expected: set[int], what: str) -> dict[str, Any]:
    missing = sorted(expected - set(have))
    if not have:
        return {"status": "failed", "reason": f"no rank wrote {what}"}
    if missing:
        return {"status": "partial", "reason": f"no {what} from rank(s) {rank_ranges(missing)}", "missing": missing}
    return {"status": "ok"}


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    xs = sorted(set(ranks))
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def build(run: rundir.RunDir) -> dict[str, Any]:
    launchers = rundir.read_launcher_records(run)
    ranks: dict[int, dict[str, Any]] = {}
    metas: dict[int, RankMeta] = {}
    for r in run.ranks():
        info, meta = _rank_summary(run, r)
        ranks[r] = info
        if meta is not None:
            metas[r] = meta
    world_sizes = [m.world_size for m in metas.values() if m.world_size is not None]
    world_size = max(world_sizes) if world_sizes else (len(ranks) or None)
    first_meta = metas[min(metas)] if metas else RankMeta()

    failed = []
    for r, info in ranks.items():
        ex = info.get("exit") or {}
        if ex.get("status") == "exception":
            # redacted when written (meta.json's own text is redacted too: a second guard)
            reason = safe_redact(f"{ex.get('type')}: {ex.get('message')}")
            failed.append({"rank": r, "reason": reason, "step": ex.get("step")})
        elif ex.get("status") == "running":
            failed.append({"rank": r, "reason": "no clean exit recorded (killed, or still running)", "step": info.get("last_step")})

    exit_codes = [l.get("exit_code") for l in launchers if l.get("exit_code") is not None]
    exit_code = next((c for c in exit_codes if c != 0), exit_codes[0] if exit_codes else None)
    hosts = sorted({l.get("host") for l in launchers if l.get("host")} | {m.host for m in metas.values() if m.host})
    started = min((l["started"] for l in launchers if l.get("started")), default=None)
    ended_all = [l.get("ended") for l in launchers]
    lead = launchers[0] if launchers else {}
    status = _collector_status(run, ranks, metas, world_size, launchers)
    return {
        "format": rundir.FORMAT,
        "format_version": rundir.FORMAT_VERSION,
        "pardiag_version": __version__,
        "run_id": lead.get("run_id"),
        "job_key": lead.get("job_key"),
        "command": lead.get("command"),
        "launcher": lead.get("launcher"),
        "started": started,
        "ended": max(ended_all) if ended_all and all(ended_all) else None,
        "complete": bool(launchers) and all(l.get("status") == "ended" for l in launchers),
        "exit_code": exit_code,
        "world_size": world_size,
        "backend": first_meta.backend,
        "device_type": first_meta.device.type if first_meta.device else None,
        "hosts": hosts,
        "versions": first_meta.fact("versions"),
        "profiler": lead.get("profiler"),
        "env": lead.get("env"),
        "nccl_env": lead.get("nccl"),
        "collectors": status,
        "ranks": [ranks[r] for r in sorted(ranks)],
        "failed_ranks": failed,
        "launchers": [
            {k: l.get(k) for k in ("host", "pid", "status", "exit_code", "started", "ended", "signals_received", "killed_by_signal", "error")}
            for l in launchers
        ],
        "written": time.time(),
    }


def write(run: rundir.RunDir) -> dict[str, Any]:
    with locked(run):
        doc = build(run)
        rundir.atomic_write_json(run.manifest, doc)
    return doc


def write_launcher_record(run: rundir.RunDir, record: dict[str, Any]) -> Path:
    path = run.launcher_record(record["host"], record["pid"])
    doc = dict(record)
    doc["format"] = rundir.LAUNCHER_FORMAT
    doc["format_version"] = rundir.LAUNCHER_VERSION
    rundir.atomic_write_json(path, doc)
    return path
