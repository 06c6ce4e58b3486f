"""What every benchmark record says about where and how it was taken: the script, the command, the
commit, the machine and the versions (`write_record` stamps them on every record), and percentiles in
one shape. Figures are comparable only within one record."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version

import numpy as np
from codecstream.testing.random_codes import random_codes

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
#: Instruction-set extensions that change which kernels the runtimes pick.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def _cpuinfo_field(name: str) -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def commit() -> str:
    """The commit the benchmark ran at: CODECSTREAM_COMMIT where set (a device machine's copy of the
    tree carries a stale .git of its own), else git's, with "+changes" for edits git can see."""
    if os.environ.get("CODECSTREAM_COMMIT"):
        return os.environ["CODECSTREAM_COMMIT"]
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip()  # fmt: skip
            return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _lscpu() -> dict:
    """lscpu's CPU identity (a VM's model name can be as short as "AMD EPYC": family and model say
    which generation); {} where there is no lscpu."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    wanted = ("Vendor ID", "Model name", "CPU family", "Model", "Stepping", "Hypervisor vendor")
    return {name: fields[name].strip() for name in wanted if name in fields}


def other_processes(min_cpu_percent: float = 5.0) -> list[str]:
    """The other processes using the CPU now (ps: %CPU since each started, then the command's start),
    besides this one and its children: what else ran on the machine during a run."""
    try:
        text = subprocess.run(
            ["ps", "-eo", "pid,ppid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in text.splitlines()[1:]:
        pid, ppid, cpu, command = line.split(None, 3)
        if float(cpu) >= min_cpu_percent and os.getpid() not in (int(pid), int(ppid)):
            found.append(f"{cpu}% {command[:120]}")
    return found


def machine() -> dict:
    """The CPU (model and the extensions that matter), memory, OS, Python, how loaded the machine
    was at the start, the commit, the exact command and the date."""
    flags = _cpuinfo_field("flags").split()
    return {
        "cpu": _cpuinfo_field("model name") or platform.processor() or "unknown",
        "lscpu": _lscpu(),
        "logical_cpus": os.cpu_count(),
        "isa": [flag for flag in _ISA_FLAGS if flag in flags],
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # Other work on this 2-core machine during the run inflates tails: say how loaded it was.
        "load_average_1m_at_start": os.getloadavg()[0],
        "commit": commit(),
        "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def build_openvino_operations(cache: pathlib.Path | str | None = None) -> None:
    """Build codecstream's OpenVINO operations into the client's cache, as an install script does
    ahead of a first decoder (runtimes/openvino_extension.py), and copy them into `cache` (a fresh
    client cache) if given. A decoder opened before they are built runs unfused while they build
    beside it: a benchmark of the fused decoder builds them first. Where they cannot be built, the
    decoder runs unfused and logs why."""
    from codecstream.client.cache import cache_root

    module = "codecstream.client.runtimes.openvino_extension"
    subprocess.run([sys.executable, "-m", module], capture_output=True, timeout=600, check=False)
    built = cache_root() / "openvino-ops"
    if cache is not None and built.is_dir():
        shutil.copytree(built, pathlib.Path(cache) / "openvino-ops", dirs_exist_ok=True)


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started its program. Not getrusage's
    ru_maxrss: Linux carries into it, across fork and exec, the resident size of the process that
    spawned this one, so every worker of a driver that holds 1.9 GB reported at least 1.9 GB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource  # not Linux: the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def versions(*packages: str) -> dict:
    """Installed versions of `packages` (None for one that is not installed)."""
    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def percentiles(values) -> dict:
    """p50, p90, p99 and max of `values`; {} when there are none."""
    if len(values) == 0:
        return {}
    array = np.asarray(values, dtype=float)
    return {name: float(np.percentile(array, q)) for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))}


def cdf_ms(seconds) -> list[float]:
    """The distribution of `seconds` in ms at every percent, 0 to 100: what a plot of it draws, without
    the raw samples (a long run has hundreds of thousands)."""
    if len(seconds) == 0:
        return []
    return [round(float(v) * 1000, 2) for v in np.percentile(np.asarray(seconds, dtype=float), np.arange(101))]


#: Versions every record carries, beside those its benchmark names: codecstream's own distributions
#: and what every role runs on.
BASE_PACKAGES = (
    "codecstream-protocol",
    "codecstream-client",
    "codecstream-server",
    "codecstream-decoder",
    "codecstream-export",
    "numpy",
    "grpcio",
    "protobuf",
)


def script() -> str:
    """The benchmark script this process runs, as the repository names it ("benchmarks/soak_bench.py")."""
    path = pathlib.Path(sys.argv[0]).resolve()
    root = pathlib.Path(__file__).resolve().parent.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else f"benchmarks/{path.name}"


def stamp(record: dict) -> dict:
    """`record` with where it came from: the script, the exact command, the commit, the machine and the
    versions. What the record already says is kept (a benchmark takes `machine()` before its run, when
    the load average is the machine's own); what it lacks is added now."""
    where = record.get("machine") if isinstance(record.get("machine"), dict) else machine()
    stamped = {
        "script": script(),
        "command": where.get("command") or " ".join([pathlib.Path(sys.executable).name, *sys.argv]),
        "commit": where.get("commit") or commit(),
        **record,
    }
    stamped["machine"] = {**where, "commit": stamped["commit"], "command": stamped["command"]}
    own = record.get("versions", {})
    stamped["versions"] = {"python": platform.python_version(), **versions(*BASE_PACKAGES), **own}
    return stamped


def write_record(record: dict, out: pathlib.Path, plot=None) -> None:
    """The JSON record at `out`, stamped (`stamp`), and, given a `plot(record, path)`, its plot beside it
    (same name, .png)."""
    record = stamp(record)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    if plot is not None:
        plot(record, out.with_suffix(".png"))


def decode_call_seconds(decoder, chunk: int, calls: int, seed: int) -> list[float]:
    """Seconds per `decoder.decode` call of `chunk` frames along one stream that carries its state;
    the stream's first call is not timed (it may pay a first-shape cost)."""
    stream = random_codes(chunk * (calls + 1), seed)
    decoder.reset()
    decoder.decode(stream[:chunk])
    times = []
    for index in range(1, calls + 1):
        began = time.perf_counter()
        decoder.decode(stream[index * chunk : (index + 1) * chunk])
        times.append(time.perf_counter() - began)
    return times
