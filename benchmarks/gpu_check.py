"""GPU check: pardiag end to end on one NVIDIA GPU, in one command, in under 8 minutes.

    make gpu-wheels     # where pip works: the wheels the GPU image lacks, into .whl/
    make gpu-check      # on the GPU machine: installs .whl/ without network, then checks
    python3 benchmarks/gpu_check.py --wheels .whl [--out DIR] [--steps N]   # the same, no make

Runs, each with examples/train_ddp.py under `torchrun --standalone` (logs in the run folder):

  plain   1 rank, NCCL, without pardiag: the baseline step times
  nccl    the same job under `pardiag run`
  gloo2   2 ranks, gloo on CUDA tensors, both ranks on the one GPU (NCCL refuses two ranks
          on one device): multi-rank GPU traces
  probe   1 rank, NCCL, a loop of all_to_all and an averaging all_reduce, under `pardiag run`.
          With one rank NCCL launches no kernel for DDP's in-place sum all-reduce; for
          these it does launch work: NCCL 2.28.9 on an H200 copies with cudaMemcpy for the
          all_to_all and runs its one-rank reduce kernel (oneRankReduce) for the average.
          No ncclDevKernel_* runs with one rank per communicator, and NCCL refuses two
          ranks on one GPU: on a one-GPU machine their classification stays unverified
          (the kernels check says so and asks for the one-rank reduce kernel instead).
  plain2, nccl2   the plain and pardiag runs again, in the reverse order: the overhead is
          judged on both pairs pooled, so that a machine that drifts between runs does not
          decide it (one pair on the H200 measured 1.19x, its steps 15 to 42 ms).
  mp_fp32, mp_fp32_plain, mp_bf16_plain   a GEMM-bound size of the example (d_model 2048,
          4 layers, sequences of 512; fp32 without TF32) under pardiag, then without it in
          fp32 and in bf16: the mixed-precision estimate against the change applied.

Checks (one line each; a failed one says why):

  run <name>   the job exited 0 within its time; `pardiag run` wrote analysis.json
  nccl         the Analysis `nccl` block parsed the run's NCCL log: NCCL's version equals
               the one torch loaded; a transport, network or bootstrap interface is named
  kernels      every GPU rank has CUDA compute kernels; every kernel named nccl* is
               communication; some ncclDevKernel_* kernel was seen; the Analysis has no
               "match no known kernel class" notice
  nvml         ranks/<r>/telemetry.jsonl holds NVML samples and the `telemetry` block is ok
  memory       every GPU rank's memory by category comes from the CUDA allocator: peak
               allocated <= reserved, activations from the sampled steps, the categories
               within the peak, a step-end count
  gpu vs HTA   each rank's Analysis `gpu` block equals HTA's own temporal breakdown and
               comm/compute overlap of the same trace (the comparison of
               tests/hta_reference.py, as tests/analyzers/test_gpu_breakdown_hta.py uses it), and
               gpu_breakdown() of the trace itself
  overhead     median step time outside the profiler window (steps.jsonl) over the plain
               run's median step time, at most --max-overhead (both pairs pooled)
  estimate     the fp32 run has a mixed_precision finding whose estimated saving is within
               5 points of the one measured between the plain fp32 and bf16 runs

Step times of the plain run come from the example's own --step-log: one line per optimizer
step, timed from one optimizer.step() return to the next, the boundary at which pardiag
ends a step too. The pardiag run passes --step-log as well, so both pay for it, and the
figures show the ratio on both clocks (pardiag's steps.jsonl and the script's log). A
pardiag run with --no-profile would not be a baseline: its hooks and sitecustomize still run.

Figures (versions, GPU, kernel counts by class, NVML samples, gpu block vs HTA, step-time
ratio) are printed as a table and written as JSON to $OUT/gpu_check.json when OUT is set
(with the run folders as gpu_check_runs.tar.gz), else to RUN_FOLDER/gpu_check.json.

--evaluate DIR runs nothing: it analyses the run folders of an earlier check (the tarball,
unpacked) again with this checkout, on any machine, and makes the same checks; a fix
found after a GPU session can be checked on its own runs without another one.

Exit codes: 0 every check passed; 1 a check failed; 2 cannot start (a missing package,
bad arguments); 3 no NVIDIA GPU here (one line, nothing run). --cpu-dry-run runs the same
jobs on the CPU with gloo to try the plumbing without a GPU; its GPU checks then fail.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import overhead  # noqa: E402  (same folder: step-log parsing and the profiler-window split)

EXIT_OK, EXIT_FAILED, EXIT_SETUP, EXIT_NO_GPU = 0, 1, 2, 3
PROG = "gpu-check"

# What pardiag needs that the GPU image ('cuda' kind) does not hold: the image has torch,
# numpy, pandas, networkx, psutil, pyyaml, narwhals, packaging, rich, jinja2, markupsafe,
# markdown-it-py, pygments, nvidia-ml-py and pytest. HolisticTraceAnalysis imports only
# pandas, numpy, plotly, networkx, psutil, yaml at import time; its jupyterlab and pydot
# requirements are left behind (the wheels install with --no-deps).
IMAGE_LACKS = ("msgspec", "plotly", "textual", "mdit-py-plugins", "platformdirs",
               "linkify-it-py", "HolisticTraceAnalysis")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64")
WHEELS_MAX_MIB = 40
SITE = Path("/tmp/pardiag-gpu-site")
# modules the check itself needs (import names), beyond torch
NEEDED_MODULES = ("numpy", "msgspec", "plotly", "jinja2", "rich", "pynvml", "hta.trace_analysis")

GPU_MODEL = ("--d-model", "256", "--layers", "4", "--heads", "8", "--batch-size", "32",
             "--seq-len", "128", "--log-every", "1000000")
CPU_MODEL = ("--log-every", "1000000")  # the example's own small default
# GEMM-bound in fp32 on an H200 (about 10 TFLOP a step; TF32 is off by default): where mixed
# precision is the lever, its estimate is checked against the bf16 run of the same job
GPU_GEMM_MODEL = ("--d-model", "2048", "--layers", "4", "--heads", "16", "--batch-size", "16",
                  "--seq-len", "512", "--dataset-size", "4096", "--log-every", "1000000")
ESTIMATE_STEPS = 30
MAX_ESTIMATE_ERROR_PP = 5.0  # issue 15's target for every lever's estimate
RUN_TIMEOUT_S = 180.0
ANALYZE_TIMEOUT_S = 150.0
RESERVE_S = 60.0  # kept back from the runs for the analyses and HTA
MIN_SAMPLES = 5
HTA_REL = 1e-9  # "equal": pardiag reproduces HTA 0.5's arithmetic, not an approximation
UNKNOWN_KERNEL_NOTICE = "match no known kernel class"
TARBALL_MAX_BYTES = 15 << 20


class SetupError(Exception):
    """The check cannot start; the message is the one line to print."""


# --------------------------------------------------------------------------- results


@dataclass
class Check:
    name: str
    problems: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.name}" + (f": {self.detail}" if self.detail else "")
        return f"FAIL  {self.name}: " + "; ".join(self.problems)


@dataclass(frozen=True)
class RunSpec:
    name: str
    nproc: int
    backend: str
    under_pardiag: bool
    script_args: tuple[str, ...]
    report: bool = False
    needs_gpu: bool = True
    measure: bool = True  # the factors after the job (GEMM timing with CUDA events on a GPU)
    model: bool = True  # trains a model (forward and backward): activations to measure


@dataclass
class RunResult:
    spec: RunSpec
    folder: Path  # the pardiag run directory, or the plain run's log prefix folder
    steps_log: Path  # prefix of the script's --step-log (".rank<r>" appended)
    wall_s: float = 0.0
    error: str | None = None
    analysis: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------- set-up


def gpu_absent_reason() -> str | None:
    """None when torch sees an NVIDIA GPU, else the reason in a few words."""
    try:
        import torch
    except ImportError as e:
        raise SetupError(f"{PROG}: torch cannot be imported here ({e}): nothing checked") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available()
    if available:
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return f"no NVIDIA GPU visible to torch {torch.__version__} ({build})"


def install_wheels(folder: Path, site: Path) -> int:
    """pip-installs every wheel of `folder` into `site` without network; the number installed."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise SetupError(f"{PROG}: installing the wheels of {folder} failed: {last}")
    return len(wheels)


def prepend_path(entry: Path) -> None:
    """`entry` first on this process's import path and on its children's PYTHONPATH."""
    sys.path.insert(0, str(entry))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(entry) + (os.pathsep + old if old else "")
    importlib.invalidate_caches()


def _source_dir(package: str, mapping: dict[str, str]) -> Path:
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in mapping:
            return ROOT / mapping[head] / Path(*parts[i:])
    return ROOT / Path(*parts)


def stage_source(dest: Path) -> Path:
    """Lays the source tree out as the installed `pardiag.*` packages (what a wheel holds,
    from pyproject's package-dir mapping) under `dest`, so this checkout runs uninstalled."""
    try:
        import tomllib
    except ImportError:
        raise SetupError(f"{PROG}: pardiag is not installed and Python "
                         f"{sys.version.split()[0]} has no tomllib to read pyproject.toml") from None
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping, data = cfg.get("package-dir", {}), cfg.get("package-data", {})
    for package in cfg["packages"]:
        src, out = _source_dir(package, mapping), dest / Path(*package.split("."))
        out.mkdir(parents=True, exist_ok=True)
        files = [*src.glob("*.py"), *(f for pattern in data.get(package, []) for f in src.glob(pattern))]
        for f in files:
            if f.is_file():
                target = out / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
    return dest


def use_this_checkout(work: Path) -> str:
    """Makes `import pardiag` load this checkout's code; says how."""
    spec = importlib.util.find_spec("pardiag")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is not None and origin.is_relative_to(ROOT):
        return "installed from this checkout"
    prepend_path(stage_source(work / "src"))
    return "this checkout, uninstalled"


def requirement_problems() -> list[str]:
    """pardiag's requirements (pyproject.toml, torch aside) missing or too old here. A failed
    check, not a stop: the runs may still work, and then say more than this would."""
    try:
        import tomllib
    except ImportError:
        return [f"Python {sys.version.split()[0]} has no tomllib to read pyproject.toml"]
    from packaging.requirements import Requirement

    problems = []
    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(text)
        if req.name == "torch" or (req.marker is not None and not req.marker.evaluate()):
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{req.name} not installed")
            continue
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} (pardiag asks {req.specifier})")
    return problems


def import_problems() -> list[str]:
    """Modules the check cannot do without that do not import here."""
    problems = []
    for module in NEEDED_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except Exception as e:  # any import failure is the same answer: not usable
            problems.append(f"{module} ({type(e).__name__}: {e})")
    return problems


# --------------------------------------------------------------------------- wheels


def wheel_requirements(names: Iterable[str] = IMAGE_LACKS) -> list[str]:
    """name==version for each package, at the version this environment has (and tests with)."""
    out, missing = [], []
    for name in names:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise SetupError(f"{PROG}: not installed here, so no version to fetch: {', '.join(missing)}")
    return out


def download_command(requirements: Sequence[str], dest: Path, python_version: str) -> list[str]:
    platforms = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", *platforms,
            "-d", str(dest), *requirements]


def download_wheels(dest: Path, python_version: str, extra: Sequence[str]) -> int:
    requirements = wheel_requirements([*IMAGE_LACKS, *extra])
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install
        old.unlink()
    proc = subprocess.run(download_command(requirements, dest, python_version))
    if proc.returncode != 0:
        print(f"{PROG}: pip download failed (exit {proc.returncode})", file=sys.stderr)
        return EXIT_SETUP
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest} (for Python {python_version})")
    if total > WHEELS_MAX_MIB << 20:
        print(f"{PROG}: over {WHEELS_MAX_MIB} MiB", file=sys.stderr)
        return EXIT_SETUP
    return EXIT_OK


# --------------------------------------------------------------------------- the NCCL probe


def nccl_probe_worker(steps: int, backend: str) -> int:
    """Runs inside torchrun (under `pardiag run`): collectives that make NCCL launch kernels
    with one rank, around a small training step so that pardiag counts steps."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend)
    cuda = backend == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())) \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    layer = torch.nn.Linear(1024, 1024, device=device)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    send = torch.randn(1 << 20, device=device)
    recv = torch.empty_like(send)
    for _ in range(steps):
        layer(x).square().mean().backward()
        dist.all_to_all_single(recv, send)  # NCCL: send/receive to self, ncclDevKernel_SendRecv
        if cuda:
            dist.all_reduce(recv, op=dist.ReduceOp.AVG)  # NCCL's one-rank reduce kernel
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- runs


def run_specs(steps: int, cpu: bool) -> list[RunSpec]:
    """The jobs, most important first (a spent time budget skips the last). On a GPU the
    nccl run measures the factors after the job (its GEMMs timed with CUDA events); the
    others, and every run of a CPU dry run, skip that (10-15 s a run of no check's).
    plain2 and nccl2 repeat the overhead pair in reverse order; the mp_* runs check the
    mixed-precision estimate (last: the first to go when time runs short)."""
    one = "gloo" if cpu else "nccl"
    example = (str(EXAMPLE), *(CPU_MODEL if cpu else GPU_MODEL))
    gemm = (str(EXAMPLE), *(CPU_MODEL if cpu else GPU_GEMM_MODEL))
    return [
        RunSpec("nccl", 1, one, True, (*example, "--backend", one, "--steps", str(steps)), report=True,
                measure=not cpu),
        RunSpec("plain", 1, one, False, (*example, "--backend", one, "--steps", str(steps)), needs_gpu=False),
        RunSpec("gloo2", 2, "gloo", True, (*example, "--backend", "gloo", "--steps", "30"), measure=False),
        RunSpec("probe", 1, one, True, (str(Path(__file__).resolve()), "--nccl-probe-worker",
                                        "--probe-backend", one, "--probe-steps", "15"), measure=False, model=False),
        # the overhead's second pair, in the reverse order: nccl plain ... plain2 nccl2 balances a
        # machine that drifts (one pair on the H200 saw 1.19x with 15-40 ms steps of a 16 ms job)
        RunSpec("plain2", 1, one, False, (*example, "--backend", one, "--steps", str(steps)), needs_gpu=False),
        RunSpec("nccl2", 1, one, True, (*example, "--backend", one, "--steps", str(steps)), measure=False),
        # the mixed-precision estimate against the change applied: fp32 under pardiag (the
        # factors measured after it at the job's shapes), then fp32 and bf16 without it
        RunSpec("mp_fp32", 1, one, True, (*gemm, "--backend", one, "--steps", str(ESTIMATE_STEPS))),
        RunSpec("mp_fp32_plain", 1, one, False, (*gemm, "--backend", one, "--steps", str(ESTIMATE_STEPS)),
                needs_gpu=False),
        RunSpec("mp_bf16_plain", 1, one, False, (*gemm, "--backend", one, "--steps", str(ESTIMATE_STEPS),
                                                 "--precision", "bf16"), needs_gpu=False),
    ]


def job_command(spec: RunSpec, work: Path) -> tuple[list[str], RunResult]:
    folder = work / spec.name
    steps_log = work / f"{spec.name}.steps"
    script = list(spec.script_args)
    if script[0] == str(EXAMPLE):
        script += ["--step-log", str(steps_log)]
    cmd = [*overhead.torchrun(), "--standalone", "--nproc-per-node", str(spec.nproc), *script]
    if spec.under_pardiag:
        cmd = [sys.executable, "-m", "pardiag", "run", "--out", str(folder),
               *([] if spec.report else ["--no-report"]), *([] if spec.measure else ["--no-measure"]), "--", *cmd]
    return cmd, RunResult(spec, folder, steps_log)


def run_job(spec: RunSpec, work: Path, timeout: float) -> RunResult:
    cmd, result = job_command(spec, work)
    t0 = time.monotonic()
    try:
        overhead.run_logged(cmd, work / f"{spec.name}.out", timeout, f"run {spec.name}")
    except overhead.BenchError as e:
        result.error = str(e).splitlines()[0] + _last_error(work / f"{spec.name}.out")
    result.wall_s = time.monotonic() - t0
    if result.ok and spec.under_pardiag:
        from pardiag.rundir import RunDir

        rd = RunDir(result.folder)
        missing = [p.name for p in (rd.analysis, *([rd.report] if spec.report else [])) if not p.is_file()]
        if missing:
            result.error = f"`pardiag run` wrote no {' and no '.join(missing)}"
    return result


def _last_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln.strip() for ln in lines if re.search(r"\b\w*(Error|Exception)\b:", ln)]
    return f" ({errors[-1][:200]})" if errors else ""


def analyze(run: Path, timeout: float, force: bool = False) -> dict[str, Any]:
    """The Analysis of a run directory, as `pardiag analyze RUN --json --hta` prints it
    (with `force`, computed again rather than read from the run's analysis.json)."""
    proc = subprocess.run([sys.executable, "-m", "pardiag", "analyze", str(run), "--json", "--hta",
                           *(["--force"] if force else [])],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"pardiag analyze exited {proc.returncode}: {last[:200]}")
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- NCCL


def nccl_version_text(version: Any) -> str | None:
    """torch.cuda.nccl.version() (a tuple, or an int in old torch) as "2.21.5"."""
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version[:3])
    if isinstance(version, int) and version > 0:  # NCCL_VERSION_CODE: 2.9 on x*10000, before x*1000
        major, rest = divmod(version, 10000 if version >= 10000 else 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return None


def nccl_figures(block: dict[str, Any]) -> dict[str, Any]:
    hosts = block.get("hosts") or []
    transports = sorted({t for per_host in (block.get("transports") or {}).values() for t in per_host})
    return {
        "files": block.get("files", 0),
        "processes": block.get("processes", 0),
        "versions": sorted({v for h in hosts for v in h.get("versions") or []}),
        "transports": transports,
        "networks": sorted({n for h in hosts for n in h.get("networks") or []}),
        "bootstrap_interfaces": sorted({n for h in hosts for n in h.get("bootstrap_interfaces") or []}),
        "warnings": block.get("warnings") or [],
        "errors": block.get("errors") or [],
    }


def nccl_problems(block: dict[str, Any], expected_version: str | None) -> list[str]:
    """What the `nccl` block of a one-node NCCL run lacks. With one rank NCCL connects no
    peer, so a network or bootstrap interface stands in for a transport."""
    if not block or not block.get("files"):
        return ["the Analysis has no nccl block (no NCCL log was read)"]
    f = nccl_figures(block)
    problems = []
    if not f["versions"]:
        problems.append("no NCCL version found in the log")
    elif expected_version and expected_version not in {v.split("+")[0] for v in f["versions"]}:
        problems.append(f"log says NCCL {', '.join(f['versions'])}, torch loaded {expected_version}")
    if not (f["transports"] or f["networks"] or f["bootstrap_interfaces"]):
        problems.append("no transport, network or bootstrap interface parsed from the log")
    problems += [f"NCCL error in the log: {e}" for e in f["errors"][:2]]
    return problems


# --------------------------------------------------------------------------- kernels


def kernel_census(trace: Path) -> dict[str, Any]:
    """GPU events of one trace by pardiag's kernel class, and the NCCL kernels among them."""
    from pardiag.analyzers.kernels import KernelKind, event_kinds
    from pardiag.analyzers.trace import load_trace

    t = load_trace(trace)
    kinds = event_kinds(t.gpu.name_id, t.gpu.cat_id, t.names, t.cats)
    counts = {k.name.lower(): int((kinds == k).sum()) for k in KernelKind}
    by_name: dict[str, dict[str, int]] = {}
    for name_id, kind in zip(t.gpu.name_id.tolist(), kinds.tolist()):
        per = by_name.setdefault(t.names[name_id], {})
        per[KernelKind(kind).name.lower()] = per.get(KernelKind(kind).name.lower(), 0) + 1
    nccl = {n: per for n, per in by_name.items() if "nccl" in n.lower()}
    return {
        "events": len(t.gpu),
        "by_class": counts,
        "nccl_dev_kernels": sum(sum(per.values()) for n, per in nccl.items() if n.startswith("ncclDevKernel_")),
        "nccl_kernels": {n[:120]: per for n, per in sorted(nccl.items())[:20]},
        "other_names": sorted(n[:120] for n, per in by_name.items() if "other" in per)[:10],
        "one_rank_reduce": sum(sum(per.values()) for n, per in by_name.items() if "oneRankReduce" in n),
    }


def kernel_problems(census: dict[str, dict[int, dict[str, Any]]],
                    notices: dict[str, list[str]], gpus: int | None = None) -> list[str]:
    """census: run -> rank -> kernel_census(); notices: run -> the Analysis' notice texts;
    gpus: the GPUs this machine has (None: unknown, judged as several). On one GPU NCCL
    gets one rank per communicator and launches no ncclDevKernel_*: it copies with
    cudaMemcpy (all_to_all, 2.28) or runs its one-rank reduce kernel (an averaging
    all_reduce), so there the one-rank reduce kernel stands in as the sign that NCCL ran."""
    problems = []
    for run, ranks in census.items():
        for rank, c in sorted(ranks.items()):
            if c["by_class"]["computation"] == 0:
                problems.append(f"{run} rank {rank}: no CUDA compute kernel in the trace")
            wrong = [n for n, per in c["nccl_kernels"].items() if set(per) != {"communication"}]
            if wrong:
                problems.append(f"{run} rank {rank}: NCCL kernel not counted as communication: {wrong[0]}")
    seen = lambda key: any(c[key] for ranks in census.values() for c in ranks.values())  # noqa: E731
    if census and not seen("nccl_dev_kernels"):
        if gpus is not None and gpus < 2:
            if not seen("one_rank_reduce"):
                problems.append("no NCCL kernel in any trace: neither ncclDevKernel_* nor, as one GPU gives, "
                                "NCCL's one-rank reduce")
        else:
            problems.append("no ncclDevKernel_* kernel in any trace: their classification is unverified")
    for run, texts in notices.items():
        unknown = [t for t in texts if UNKNOWN_KERNEL_NOTICE in t]
        if unknown:
            problems.append(f"{run}: {unknown[0][:200]}")
    return problems


# --------------------------------------------------------------------------- NVML


def telemetry_samples(run: Path, ranks: Iterable[int]) -> dict[int, int]:
    """NVML samples per rank in ranks/<r>/telemetry.jsonl (the header line not counted)."""
    from pardiag.rundir import RunDir

    out = {}
    for rank in ranks:
        n = 0
        try:
            with open(RunDir(run).telemetry(rank), encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    n += isinstance(rec, dict) and "t_ns" in rec and "format" not in rec
        except FileNotFoundError:
            pass
        out[rank] = n
    return out


def telemetry_problems(run: str, samples: dict[int, int], block: dict[str, Any]) -> list[str]:
    problems = [f"{run} rank {r}: {n} NVML samples in telemetry.jsonl (fewer than {MIN_SAMPLES})"
                for r, n in sorted(samples.items()) if n < MIN_SAMPLES]
    if (block or {}).get("status") != "ok":
        problems.append(f"{run}: telemetry block {(block or {}).get('status')!r}: {(block or {}).get('reason')}")
    return problems


# --------------------------------------------------------------------------- gpu block vs HTA


def _hta_reference() -> Any:
    """The suite's HTA comparison (tests/hta_reference.py): `hta_numbers` runs HTA on a
    folder of traces, `ours` maps a trace's gpu_breakdown to HTA's names, `compare` asserts."""
    folder = str(ROOT / "tests")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import hta_reference

    return hta_reference


def gpu_block_numbers(gpu: dict[str, Any]) -> dict[str, float]:
    """An Analysis `gpu` block in HTA's terms (the names `ours` gives a GpuBreakdown)."""
    comm = gpu["comm_us"]
    return {"idle_us": gpu["idle_us"], "compute_us": gpu["compute_us"],
            "non_compute_us": gpu["span_us"] - gpu["compute_us"] - gpu["idle_us"],
            "kernel_time_us": gpu["span_us"],
            "overlap_pct": round(100 * gpu["overlap_us"] / comm, 2) if comm > 0 else math.nan}


def _differences(ours: dict[str, float], ref: dict[str, float], compare: Callable[..., None]) -> list[str]:
    out = []
    for key, expected in ref.items():
        try:
            compare({key: ours[key]}, {key: expected}, rel=HTA_REL)
        except AssertionError:
            out.append(f"{key} {ours[key]:.6g} vs {expected:.6g}")
    return out


def compare_with_hta(traces: dict[int, Path], blocks: dict[int, dict[str, Any] | None],
                     folder: Path) -> tuple[dict[int, Any], list[str]]:
    """(per rank: pardiag's and HTA's numbers, the problems) for one run's traces."""
    problems = [f"rank {rank}: the Analysis has no gpu block" for rank in sorted(traces) if not blocks.get(rank)]
    traces = {rank: path for rank, path in traces.items() if blocks.get(rank)}
    if not traces:
        return {}, problems or ["no trace to compare"]
    ref = _hta_reference()
    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    for rank, path in traces.items():
        name = f"rank{rank}" + ("".join(path.suffixes[-2:]) if path.name.endswith(".gz") else path.suffix)
        shutil.copy(path, folder / name)
        names[name] = rank
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # HTA logs every step of its parsing
    try:
        hta = ref.hta_numbers(folder)
    finally:
        logging.disable(previous)
    figures: dict[int, Any] = {}
    for name, theirs in sorted(hta.items()):
        rank = names[name]
        ours = gpu_block_numbers(blocks[rank])  # type: ignore[arg-type]
        direct = ref.ours(traces[rank])
        vs_hta, vs_trace = _differences(ours, theirs, ref.compare), _differences(ours, direct, ref.compare)
        figures[rank] = {"analysis": ours, "hta": theirs, "gpu_breakdown": direct, "equal": not (vs_hta or vs_trace)}
        if vs_hta:
            problems.append(f"rank {rank}: Analysis vs HTA: " + ", ".join(vs_hta))
        if vs_trace:
            problems.append(f"rank {rank}: Analysis vs gpu_breakdown of its trace: " + ", ".join(vs_trace))
    for rank in sorted(set(traces) - set(names[n] for n in hta)):
        problems.append(f"rank {rank}: HTA returned nothing for its trace")
    return figures, problems


# --------------------------------------------------------------------------- step times


def _durations(records: Iterable[dict[str, Any]], first: int) -> list[float]:
    return [float(r["dur_us"]) for r in records if r["step"] >= first
            and isinstance(r.get("dur_us"), (int, float)) and not isinstance(r.get("dur_us"), bool)]


def _median_ms(values: Sequence[float]) -> float | None:
    return statistics.median(values) / 1e3 if values else None


def step_time_figures(pardiag_steps: list[dict[str, Any]], script_steps: list[dict[str, Any]],
                      plain_steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median step times (ms) and their ratios to the plain run. pardiag_steps: the run's
    steps.jsonl; script_steps: the same run's --step-log; plain_steps: the plain run's."""
    outside, active = overhead.split_window(pardiag_steps)
    script_outside, _ = overhead.split_window(overhead.with_durations_from(pardiag_steps, script_steps))
    plain = _median_ms(_durations(plain_steps, overhead.SKIP_FIRST))

    def ratio(x: float | None) -> float | None:
        return x / plain if x is not None and plain else None

    outside_ms, script_ms, active_ms = _median_ms(outside), _median_ms(script_outside), _median_ms(active)
    return {"plain_ms": plain, "outside_ms": outside_ms, "outside_script_ms": script_ms, "active_ms": active_ms,
            "ratio": ratio(outside_ms), "ratio_script_timer": ratio(script_ms), "active_ratio": ratio(active_ms),
            "steps": {"plain": len(plain_steps), "outside": len(outside), "active": len(active)}}


def pooled_step_time_figures(pardiag_runs: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]],
                             plain_runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """step_time_figures over several runs: the medians of every run's steps together (each
    run split at its own window), and each pair's figures under "pairs" (i-th pardiag run
    with the i-th plain run), so that drift between runs shows."""
    outside: list[float] = []
    script_outside: list[float] = []
    active: list[float] = []
    for steps, script in pardiag_runs:
        o, a = overhead.split_window(steps)
        outside, active = outside + o, active + a
        script_outside += overhead.split_window(overhead.with_durations_from(steps, script))[0]
    plain = [d for run in plain_runs for d in _durations(run, overhead.SKIP_FIRST)]
    plain_ms = _median_ms(plain)

    def ratio(x: float | None) -> float | None:
        return x / plain_ms if x is not None and plain_ms else None

    outside_ms, script_ms, active_ms = _median_ms(outside), _median_ms(script_outside), _median_ms(active)
    fig: dict[str, Any] = {
        "plain_ms": plain_ms, "outside_ms": outside_ms, "outside_script_ms": script_ms, "active_ms": active_ms,
        "ratio": ratio(outside_ms), "ratio_script_timer": ratio(script_ms), "active_ratio": ratio(active_ms),
        "steps": {"plain": sum(len(r) for r in plain_runs), "outside": len(outside), "active": len(active)}}
    if len(pardiag_runs) > 1 or len(plain_runs) > 1:
        fig["pairs"] = [step_time_figures(p[0], p[1], q) for p, q in zip(pardiag_runs, plain_runs)]
    return fig


def overhead_problems(fig: dict[str, Any], max_ratio: float) -> list[str]:
    if fig.get("ratio") is None:
        return ["no step times to compare (plain run or steps outside the profiler window missing)"]
    if fig["ratio"] > max_ratio:
        return [f"steps outside the profiler window take {fig['ratio']:.3f} x the plain run's "
                f"({fig['outside_ms']:.2f} vs {fig['plain_ms']:.2f} ms; limit {max_ratio})"]
    return []


# --------------------------------------------------------------------------- the check


def versions_and_gpu(cpu: bool) -> dict[str, Any]:
    import torch

    import pardiag

    out: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "pardiag": pardiag.__version__, "nccl": None, "driver": None, "gpu": None, "gpus": 0,
    }
    for dist, key in (("HolisticTraceAnalysis", "hta"), ("msgspec", "msgspec"), ("plotly", "plotly"),
                      ("nvidia-ml-py", "nvidia_ml_py")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    if cpu:
        return out
    out["nccl"] = nccl_version_text(torch.cuda.nccl.version())
    out["gpus"] = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    out["gpu"] = props.name
    out["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        pynvml.nvmlShutdown()
    except Exception as e:  # the figure only; the nvml check says whether NVML works
        out["driver"] = f"unknown ({type(e).__name__})"
    return out


def execute_runs(specs: list[RunSpec], work: Path, deadline: float) -> list[RunResult]:
    results = []
    for spec in specs:
        left = deadline - time.monotonic() - RESERVE_S
        if left < 30:
            _, result = job_command(spec, work)
            result.error = "not run: the time budget is spent"
            results.append(result)
            continue
        print(f"{PROG}: run {spec.name} ({spec.nproc} rank{'s' if spec.nproc > 1 else ''}, "
              f"{spec.backend}{', under pardiag' if spec.under_pardiag else ''}) ...", flush=True)
        result = run_job(spec, work, min(RUN_TIMEOUT_S, left))
        if result.ok and spec.under_pardiag:
            try:
                result.analysis = analyze(result.folder, min(ANALYZE_TIMEOUT_S, max(30.0, deadline - time.monotonic())))
            except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                result.error = f"analysis failed: {str(e)[:200]}"
        results.append(result)
    return results


def _traces(run: RunResult) -> dict[int, Path]:
    from pardiag.rundir import RunDir

    rd = RunDir(run.folder)
    return {r: p for r in rd.ranks() if (p := rd.find_trace(r)[0]) is not None}


Figures = dict[str, Any]


def check_nccl(runs: list[RunResult], expected: str | None) -> tuple[Check, Figures]:
    check, figures = Check("nccl"), {}
    for r in runs:
        block = (r.analysis or {}).get("nccl") or {}
        figures[r.spec.name] = nccl_figures(block)
        check.problems += [f"{r.spec.name}: {p}" for p in nccl_problems(block, expected)]
    if not runs:
        check.problems.append("no finished NCCL run")
    else:
        f = figures[runs[0].spec.name]
        check.detail = (f"NCCL {', '.join(f['versions']) or '?'}; transports {', '.join(f['transports']) or 'none'}; "
                        f"networks {', '.join(f['networks']) or 'none'}")
    return check, figures


def check_kernels(runs: list[RunResult], gpus: int | None) -> tuple[Check, Figures]:
    census = {r.spec.name: {rank: kernel_census(path) for rank, path in _traces(r).items()} for r in runs}
    notices = {r.spec.name: [n.get("message", "") for n in (r.analysis or {}).get("notices") or []] for r in runs}
    check = Check("kernels", kernel_problems(census, notices, gpus))
    for r in runs:
        device = ((r.analysis or {}).get("run") or {}).get("device_type")
        if device != "cuda":
            check.problems.append(f"{r.spec.name}: the Analysis says device {device!r}")
    nccl_dev = sum(c["nccl_dev_kernels"] for ranks in census.values() for c in ranks.values())
    one_rank = sum(c["one_rank_reduce"] for ranks in census.values() for c in ranks.values())
    check.detail = f"{nccl_dev} ncclDevKernel_* events, no kernel of unknown class"
    if not nccl_dev and gpus is not None and gpus < 2:
        check.detail += (f"; one GPU: ncclDevKernel_* unverifiable here (NCCL's one-rank reduce x{one_rank} "
                         "instead, a computation kernel to HTA and pardiag alike)")
    return check, {"kernels": census, "notices": notices}


def check_nvml(runs: list[RunResult]) -> tuple[Check, Figures]:
    check, figures = Check("nvml"), {}
    for r in runs:
        analysis = r.analysis or {}
        samples = telemetry_samples(r.folder, [rk["rank"] for rk in analysis.get("ranks") or []])
        figures[r.spec.name] = samples
        check.problems += telemetry_problems(r.spec.name, samples, analysis.get("telemetry") or {})
    check.detail = ", ".join(f"{run} {sum(v.values())}" for run, v in figures.items()) + " samples"
    return check, figures


def memory_problems(run: str, ranks: list[dict[str, Any]], activations: bool = True) -> list[str]:
    """Memory by category on a GPU rank: measured from the CUDA allocator (device cuda,
    peak allocated and reserved, activations from the sampled steps unless the run trains
    no model (`activations` False: the probe's collectives), the categories summing to no
    more than the peak)."""
    problems = []
    for rk in ranks:
        m, where = rk.get("memory") or {}, f"{run} rank {rk.get('rank')}"
        peak = m.get("peak") or {}
        if m.get("device") != "cuda":
            problems.append(f"{where}: memory device {m.get('device')!r}, not cuda")
            continue
        alloc, res = m.get("allocated") or 0, m.get("reserved") or 0
        if not (0 < alloc <= res):
            problems.append(f"{where}: peak allocated {alloc} / reserved {res}")
        if activations and (not peak.get("activations")
                            or "sampled steps" not in (m.get("sources") or {}).get("activations", "")):
            problems.append(f"{where}: no activations from the allocator's sampled steps")
        known = sum(peak.get(k) or 0 for k in ("parameters", "gradients", "optimizer_state", "activations"))
        if peak.get("other") is None or known > alloc:
            problems.append(f"{where}: categories {known} over the peak allocated {alloc} (other {peak.get('other')})")
        if not (m.get("steady") or {}).get("total"):
            problems.append(f"{where}: no steady (step-end) allocated bytes")
    return problems


def check_memory(runs: list[RunResult]) -> tuple[Check, Figures]:
    check, figures = Check("memory"), {}
    for r in runs:
        ranks = (r.analysis or {}).get("ranks") or []
        figures[r.spec.name] = {rk.get("rank"): {k: (rk.get("memory") or {}).get(k)
                                                 for k in ("peak", "steady", "reserved", "allocated")} for rk in ranks}
        check.problems += memory_problems(r.spec.name, ranks, r.spec.model)
    check.detail = f"{sum(len(v) for v in figures.values())} GPU ranks by category"
    return check, figures


def check_hta(runs: list[RunResult], work: Path) -> tuple[Check, Figures]:
    check, figures = Check("gpu vs HTA"), {}
    for r in runs:
        analysis = r.analysis or {}
        blocks = {rk["rank"]: rk.get("gpu") for rk in analysis.get("ranks") or []}
        figures[r.spec.name], problems = compare_with_hta(_traces(r), blocks, work / "hta" / r.spec.name)
        check.problems += [f"{r.spec.name} {p}" for p in problems]
        if analysis.get("hta") is None:
            check.problems.append(f"{r.spec.name}: `pardiag analyze --hta` gave no hta block")
    check.detail = f"{sum(len(v) for v in figures.values())} rank traces, equal"
    return check, figures


def _profiler_meta(folder: Path, rank: int = 0) -> dict[str, Any]:
    """The profiler block of a rank's meta.json ({} when unreadable)."""
    try:
        block = json.loads((folder / "ranks" / str(rank) / "meta.json").read_text()).get("profiler")
    except (OSError, ValueError, AttributeError):
        return {}
    return block if isinstance(block, dict) else {}


def check_overhead(pardiag_runs: list[RunResult], plain_runs: list[RunResult], max_ratio: float) -> tuple[Check, Figures]:
    """The step-time ratio over every finished pair (nccl, plain; nccl2, plain2), pooled."""
    from pardiag.rundir import RunDir, read_steps

    def script_log(r: RunResult) -> list[dict[str, Any]]:
        return overhead.parse_steps_jsonl(_read_lines(Path(f"{r.steps_log}.rank0")))

    fig = pooled_step_time_figures(
        [([s.to_dict() for s in read_steps(RunDir(r.folder), 0)], script_log(r)) for r in pardiag_runs],
        [script_log(r) for r in plain_runs])
    fig["cupti_teardown"] = {r.spec.name: _profiler_meta(r.folder).get("cupti_teardown") for r in pardiag_runs}
    check = Check("overhead", overhead_problems(fig, max_ratio))
    if fig["ratio"] is not None:
        check.detail = f"x{fig['ratio']:.3f} (script's clock x{_fmt(fig['ratio_script_timer'], '.3f')})"
        if fig.get("pairs"):
            check.detail += "; pairs " + ", ".join(f"x{_fmt(p['ratio'], '.3f')}" for p in fig["pairs"])
    return check, fig


def estimate_figures(analysis: dict[str, Any], fp32_steps: list[dict[str, Any]],
                     bf16_steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The mixed_precision finding's estimate on the fp32 run and the saving measured
    between the plain fp32 and bf16 runs (their medians, warm-up steps left out)."""
    fp32, bf16 = _median_ms(_durations(fp32_steps, overhead.SKIP_FIRST)), _median_ms(_durations(bf16_steps, overhead.SKIP_FIRST))
    measured = 100 * (1 - bf16 / fp32) if fp32 and bf16 else None
    f = next((f for f in analysis.get("findings") or [] if f.get("lever") == "mixed_precision"), None)
    est = (f or {}).get("estimate") or {}
    saving = (f or {}).get("est_saving_pct")
    return {"fp32_ms": fp32, "bf16_ms": bf16, "measured_pct": measured, "finding": f is not None,
            "estimated_pct": saving, "method": est.get("method"), "factors": est.get("factors"),
            "refused": est.get("refused"), "levers": [x.get("lever") for x in analysis.get("findings") or []],
            "error_pp": saving - measured if saving is not None and measured is not None else None}


def estimate_problems(fig: dict[str, Any], max_error: float) -> list[str]:
    if fig["measured_pct"] is None:
        return ["no step times to measure the saving with (a plain run missing)"]
    if not fig["finding"]:
        return [f"bf16 saved {fig['measured_pct']:.1f}% of the fp32 step, but the fp32 run has no mixed_precision "
                f"finding (findings: {', '.join(fig['levers']) or 'none'})"]
    if fig["error_pp"] is None:
        return ["the mixed_precision finding has no estimate"]
    if abs(fig["error_pp"]) > max_error:
        return [f"mixed_precision estimated {fig['estimated_pct']:.1f}%, measured {fig['measured_pct']:.1f}% "
                f"({fig['error_pp']:+.1f} pp; limit {max_error:g}; {fig['method']})"]
    return []


def check_estimate(fp32: RunResult, fp32_plain: RunResult, bf16_plain: RunResult) -> tuple[Check, Figures]:
    def script_log(r: RunResult) -> list[dict[str, Any]]:
        return overhead.parse_steps_jsonl(_read_lines(Path(f"{r.steps_log}.rank0")))

    fig = estimate_figures(fp32.analysis or {}, script_log(fp32_plain), script_log(bf16_plain))
    check = Check("estimate", estimate_problems(fig, MAX_ESTIMATE_ERROR_PP))
    if fig["error_pp"] is not None:
        check.detail = (f"mixed precision estimated {fig['estimated_pct']:.1f}% ({fig['method']}), measured "
                        f"{fig['measured_pct']:.1f}% ({fig['fp32_ms']:.1f} -> {fig['bf16_ms']:.1f} ms): "
                        f"{fig['error_pp']:+.1f} pp")
    return check, fig


def _guarded(name: str, needs: bool, why: str, fn: Callable[[], tuple[Check, Figures]]) -> tuple[Check, Figures]:
    """A check that cannot run, or that breaks, fails with one line instead of stopping the others."""
    if not needs:
        return Check(name, [why]), {}
    try:
        return fn()
    except Exception as e:  # the check's own failure is its answer
        return Check(name, [f"the check broke: {type(e).__name__}: {str(e)[:200]}"]), {}


def evaluate(results: list[RunResult], versions: dict[str, Any], max_overhead: float,
             work: Path) -> tuple[list[Check], Figures]:
    """Every check and figure from finished runs; versions: versions_and_gpu()'s (the NCCL
    version torch loaded, the number of GPUs)."""
    expected_nccl, gpus = versions.get("nccl"), versions.get("gpus")
    checks = [Check(f"run {r.spec.name}", [r.error] if r.error else [], f"{r.wall_s:.0f} s") for r in results]
    figures: Figures = {"runs": {r.spec.name: {"ok": r.ok, "wall_s": round(r.wall_s, 1), "error": r.error,
                                               "folder": str(r.folder)} for r in results}}
    done = {r.spec.name: r for r in results if r.ok}
    profiled = [r for r in done.values() if r.spec.under_pardiag and r.analysis is not None]
    gpu_runs = [r for r in profiled if r.spec.needs_gpu]
    nccl_runs = [r for r in profiled if r.spec.backend == "nccl"]
    no_gpu_run = "no finished GPU run under pardiag"
    pairs = ([done[n] for n in ("nccl", "nccl2") if n in done and (n == "nccl" or "plain2" in done)],
             [done[n] for n in ("plain", "plain2") if n in done and (n == "plain" or "nccl2" in done)])
    for key, (check, fig) in (
        ("nccl", _guarded("nccl", bool(nccl_runs), "no finished NCCL run", lambda: check_nccl(nccl_runs, expected_nccl))),
        ("", _guarded("kernels", bool(gpu_runs), no_gpu_run, lambda: check_kernels(gpu_runs, gpus))),
        ("nvml", _guarded("nvml", bool(gpu_runs), no_gpu_run, lambda: check_nvml(gpu_runs))),
        ("memory", _guarded("memory", bool(gpu_runs), no_gpu_run, lambda: check_memory(gpu_runs))),
        ("gpu_vs_hta", _guarded("gpu vs HTA", bool(gpu_runs), no_gpu_run, lambda: check_hta(gpu_runs, work))),
        ("step_time", _guarded("overhead", "nccl" in done and "plain" in done, "needs the nccl and plain runs",
                               lambda: check_overhead(*pairs, max_overhead))),
        ("estimate", _guarded("estimate", all(n in done for n in ("mp_fp32", "mp_fp32_plain", "mp_bf16_plain"))
                              and done["mp_fp32"].analysis is not None, "needs the three mp_* runs",
                              lambda: check_estimate(done["mp_fp32"], done["mp_fp32_plain"], done["mp_bf16_plain"]))),
    ):
        checks.append(check)
        figures.update({key: fig} if key else fig)
    return checks, figures


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


# --------------------------------------------------------------------------- output


def _fmt(v: Any, spec: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def figure_lines(figures: dict[str, Any]) -> list[str]:
    v = figures.get("versions", {})
    lines = [f"python {v.get('python')}  torch {v.get('torch')}  CUDA {_fmt(v.get('cuda'))}  "
             f"NCCL {_fmt(v.get('nccl'))}  driver {_fmt(v.get('driver'))}  pardiag {v.get('pardiag')}  "
             f"HTA {_fmt(v.get('hta'))}",
             f"GPU: {_fmt(v.get('gpu'))} x{v.get('gpus', 0)}  ({v.get('pardiag_source', '')})"]
    lines.append(f"{'run':<6} {'rank':>4} {'compute':>8} {'comm':>6} {'memory':>7} {'other':>6} "
                 f"{'ncclDev':>8} {'NVML':>6}  gpu span/compute/idle us: pardiag = HTA")
    for run, ranks in figures.get("kernels", {}).items():
        for rank, c in sorted(ranks.items()):
            k = c["by_class"]
            hta = figures.get("gpu_vs_hta", {}).get(run, {}).get(rank)
            cmp = "-"
            if hta:
                a, h = hta["analysis"], hta["hta"]
                cmp = (f"{a['kernel_time_us']:.0f}/{a['compute_us']:.0f}/{a['idle_us']:.0f} "
                       f"{'=' if hta['equal'] else '!='} {h['kernel_time_us']:.0f}/{h['compute_us']:.0f}/{h['idle_us']:.0f}")
            nvml = figures.get("nvml", {}).get(run, {}).get(rank)
            lines.append(f"{run:<6} {rank:>4} {k['computation']:>8} {k['communication']:>6} {k['memory']:>7} "
                         f"{k['other']:>6} {c['nccl_dev_kernels']:>8} {_fmt(nvml):>6}  {cmp}")
    s = figures.get("step_time")
    if s:
        lines.append(f"step time: plain {_fmt(s['plain_ms'], '.2f')} ms; under pardiag outside the window "
                     f"{_fmt(s['outside_ms'], '.2f')} ms (x{_fmt(s['ratio'], '.3f')}), script's clock "
                     f"x{_fmt(s['ratio_script_timer'], '.3f')}; profiled steps x{_fmt(s['active_ratio'], '.3f')}"
                     + ("; by pair " + ", ".join(f"x{_fmt(p['ratio'], '.3f')}" for p in s["pairs"])
                        if s.get("pairs") else ""))
    e = figures.get("estimate")
    if e and e.get("measured_pct") is not None:
        lines.append(f"mixed precision: fp32 {_fmt(e['fp32_ms'], '.1f')} ms, bf16 {_fmt(e['bf16_ms'], '.1f')} ms: "
                     f"measured {_fmt(e['measured_pct'], '.1f')}%, estimated {_fmt(e['estimated_pct'], '.1f')}% "
                     f"({e.get('method') or 'no finding'})")
    return lines


def results_path(work: Path) -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu_check.json" if out else work / "gpu_check.json"


def _json_safe(obj: Any) -> Any:
    """NaN (an overlap without communication) as null; int keys as strings."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_results(path: Path, checks: list[Check], figures: dict[str, Any], code: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": "pardiag.gpu-check", "format_version": 1, "exit_code": code,
           "checks": [{**asdict(c), "ok": c.ok} for c in checks], "figures": figures}
    path.write_text(json.dumps(_json_safe(doc), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def pack_runs(work: Path, dest: Path) -> Path | None:
    """The run folders and logs (not the staged sources or HTA copies) as one tarball,
    if it stays small enough to come back from the device."""
    path = dest / "gpu_check_runs.tar.gz"
    skip = {work / "src", work / "hta"}
    with tarfile.open(path, "w:gz") as tar:
        for p in sorted(work.iterdir()):
            if p not in skip and p != path:
                tar.add(p, arcname=f"{work.name}/{p.name}")
    if path.stat().st_size > TARBALL_MAX_BYTES:
        path.unlink()
        return None
    return path


def check(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    deadline = t0 + args.budget
    work = (args.out or ROOT / "pardiag-runs" / time.strftime("gpu-check-%Y%m%d-%H%M%S")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.wheels is not None:
        n = install_wheels(args.wheels, args.site)
        if n:
            prepend_path(args.site)
    source = use_this_checkout(work)
    if problems := import_problems():
        raise SetupError(f"{PROG}: does not import: {'; '.join(problems)} "
                         "(make gpu-wheels where pip works, then carry .whl)")
    requirements = Check("requirements", requirement_problems(), "pardiag's requirements met")
    figures: dict[str, Any] = {"versions": {**versions_and_gpu(args.cpu_dry_run), "pardiag_source": source},
                               "work": str(work), "cpu_dry_run": args.cpu_dry_run}
    results = execute_runs(run_specs(args.steps, args.cpu_dry_run), work, deadline)
    checks, more = evaluate(results, figures["versions"], args.max_overhead, work)
    checks.insert(0, requirements)
    figures.update(more)
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    code = EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
    print("\n".join(figure_lines(figures)))
    for c in checks:
        print(c.line())
    path = results_path(work)
    write_results(path, checks, figures, code)
    packed = pack_runs(work, path.parent) if os.environ.get("OUT") else None
    print(f"{PROG}: {'all checks passed' if code == EXIT_OK else 'FAILED'} in {figures['wall_s']:.0f} s; "
          f"figures in {path}" + (f", runs in {packed.name}" if packed else "") + f"; run folder {work}")
    return code


def reevaluate(args: argparse.Namespace) -> int:
    """--evaluate DIR: the checks again, here, on the run folders an earlier check left in DIR
    (the tarball from the GPU machine, unpacked): each run analysed again with this
    checkout, HTA run on its traces. Versions and GPU count come from DIR's gpu_check.json
    (or its parent's) when there is one. Figures go to DIR/gpu_check.evaluated.json."""
    t0 = time.monotonic()
    work = args.evaluate.resolve()
    if not work.is_dir():
        raise SetupError(f"{PROG}: {work}: no such folder")
    source = use_this_checkout(work)
    if problems := import_problems():
        raise SetupError(f"{PROG}: does not import: {'; '.join(problems)}")
    versions: dict[str, Any] = {}
    for saved in (work / "gpu_check.json", work.parent / "gpu_check.json"):
        try:
            versions = json.loads(saved.read_text())["figures"]["versions"]
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    results = []
    for spec in run_specs(args.steps, cpu=False):
        _, result = job_command(spec, work)
        present = result.folder.is_dir() if spec.under_pardiag else Path(f"{result.steps_log}.rank0").is_file()
        if not present:
            result.error = f"not in {work}"
        elif spec.under_pardiag:
            print(f"{PROG}: analysing {spec.name} ...", flush=True)
            try:
                result.analysis = analyze(result.folder, ANALYZE_TIMEOUT_S * 2, force=True)
            except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                result.error = f"analysis failed: {str(e)[:200]}"
        results.append(result)
    checks, more = evaluate(results, versions, args.max_overhead, work)
    figures: dict[str, Any] = {"versions": {**versions, "evaluated_with": source}, "work": str(work),
                               "evaluated": True, **more}
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    code = EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
    print("\n".join(figure_lines(figures)))
    for c in checks:
        print(c.line())
    path = work / "gpu_check.evaluated.json"
    write_results(path, checks, figures, code)
    print(f"{PROG}: {'all checks passed' if code == EXIT_OK else 'FAILED'} (evaluated again in "
          f"{figures['wall_s']:.0f} s); figures in {path}")
    return code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=overhead.HelpFormatter)
    a = p.add_argument
    a("--out", type=Path, default=None, help="run folder (default: pardiag-runs/gpu-check-<time>)")
    a("--steps", type=int, default=120, help="optimizer steps of the nccl and plain runs")
    a("--max-overhead", type=float, default=1.10,
      help="largest step-time ratio (pardiag outside the profiler window / plain) that passes")
    a("--budget", type=float, default=390,
      help="seconds for the installs and runs (the HTA comparisons follow); later runs are skipped past it")
    a("--wheels", type=Path, default=None, metavar="DIR",
      help="first pip-install the wheels in DIR (no network, no dependencies) into --site")
    a("--site", type=Path, default=SITE, help="where --wheels installs")
    a("--download-wheels", type=Path, default=None, metavar="DIR",
      help="only fetch the wheels the GPU image lacks into DIR (versions of this environment), then exit")
    a("--python-version", default="3.12", help="Python version of the GPU machine, for --download-wheels")
    a("--extra-wheel", action="append", default=None, metavar="NAME",
      help="also fetch this package with --download-wheels (repeatable)")
    a("--evaluate", type=Path, default=None, metavar="DIR",
      help="run nothing: check again, here, the run folders an earlier check left in DIR (its tarball, unpacked)")
    a("--cpu-dry-run", action="store_true",
      help="no GPU needed: the same runs on the CPU with gloo, to try the plumbing (GPU checks fail)")
    a("--nccl-probe-worker", action="store_true", help=argparse.SUPPRESS)
    a("--probe-backend", default="nccl", help=argparse.SUPPRESS)
    a("--probe-steps", type=int, default=15, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 20:
        p.error("--steps must be at least 20 (steps outside the profiler window are compared)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nccl_probe_worker:
        return nccl_probe_worker(args.probe_steps, args.probe_backend)
    try:
        if args.download_wheels is not None:
            return download_wheels(args.download_wheels, args.python_version, args.extra_wheel or [])
        if args.evaluate is not None:
            return reevaluate(args)
        if not args.cpu_dry_run and (reason := gpu_absent_reason()):
            print(f"{PROG}: {reason}: nothing checked")
            return EXIT_NO_GPU
        return check(args)
    except SetupError as e:
        print(str(e), file=sys.stderr)
        return EXIT_SETUP
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
