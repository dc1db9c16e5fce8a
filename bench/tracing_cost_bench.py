"""The cost of tracing: durable steps/s and the node's CPU per step of `dex-ha dev` without
the OpenTelemetry extra, with it and tracing off, and with it exporting, in one run.

Three configurations of the same node, same code (this checkout), same load:
  A  no-extra  the node in a virtual environment without the `otel` extra (built on first use
               with `pip install -e <repo>`, no extras, each dependency at the version this
               interpreter has; cached in ~/.cache/dex-ha-bench/venv-plain, rebuilt when
               pyproject.toml or those versions change);
  B  extra     the node in this interpreter, which has the extra, and no OTLP endpoint set
               (tracing off: the configuration of a node that installed the extra and never
               pointed it anywhere);
  C  tracing   the same with OTEL_EXPORTER_OTLP_ENDPOINT set to a local OTLP receiver in this
               process that accepts and discards every export (POST /v1/traces).

The rows are interleaved, A B C A B C ... for --rounds, so the three share the same minutes
of the machine (on a small shared VM its speed drifts by more than the effect sought). Each
row starts a fresh `dex-ha dev` (strict durability, its own data dir) and measures it as
bench/steps_bench.py does: a Worker process (bench/steps_worker.py, the same interpreter for
every configuration), c concurrent sessions, a warm-up, a window; steps/s, p50 of the time
between a session's steps, and the node's CPU ms per step (utime+stime from /proc). The
ratios to A are taken per round (X / A of the same round) and summarised as their median.

A proof that each configuration is what it says: before the run, the venv's Python is
checked to find this checkout's dex_ha and no `opentelemetry`, and this interpreter to have
the extra; every C row must have sent exports to the receiver, and A and B none.

OTEL_* variables of the caller's environment are removed for the bench's processes (a
Worker or a node exporting elsewhere would measure that).

    python bench/tracing_cost_bench.py [--concurrency 64] [--duration-s 20] [--rounds 3]
    python bench/tracing_cost_bench.py --quick        # c=16, 5 s windows, 1 round

It prints a table and writes JSON (default bench/results/tracing_cost.json).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import steps_bench  # noqa: E402  (its dev node, Worker and row, reused as they are)
from bench.common import fmt, ratio  # noqa: E402

DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "tracing_cost.json"
CACHE_DIR = Path.home() / ".cache" / "dex-ha-bench"
PLAIN_VENV = "venv-plain"
VENV_KEY_FILE = "dex-ha-bench-key"  # written last: a venv without it was not finished
VENV_BUILD_DEADLINE_S = 600.0
CHECK_DEADLINE_S = 60.0
QUICK = {"concurrency": 16, "duration_s": 5.0, "rounds": 1}


@dataclass(frozen=True)
class Config:
    """How one configuration's node is started."""

    name: str  # "A", "B", "C"
    label: str
    python: str
    env: dict[str, str]
    exports: bool  # must the node send traces to the receiver?


# ---------------------------------------------------------------- the venv without the extra


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    return match.group(0) if match else ""


def installed_pins() -> list[str]:
    """`name==version` of every package that dex-ha needs without extras (pyproject.toml's
    dependencies and theirs, as installed in this interpreter), so that A runs the same
    aiohttp, uvloop, msgpack, ... as B and C, and differs from them by the extra alone."""
    pending = list(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    pins: dict[str, str] = {}
    while pending:
        name = requirement_name(pending.pop())
        normalized = re.sub(r"[-_.]+", "-", name).lower()  # typing_extensions is typing-extensions
        if not name or normalized in pins:
            continue
        try:
            pins[normalized] = f"{normalized}=={importlib.metadata.version(name)}"
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform (a marker), or not installed here: pip decides
        pending += [r for r in requires if "extra ==" not in r]
    return sorted(pins.values())


def venv_key(pins: list[str]) -> str:
    """What the cached venv depends on: pyproject.toml, the versions it pins and the Python
    that built it."""
    digest = hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes())
    digest.update("\n".join([sys.version, *pins]).encode())
    return digest.hexdigest()[:16]


def plain_venv(cache_dir: Path = CACHE_DIR) -> Path:
    """The python of a venv with dex-ha and its dependencies but not the `otel` extra; built
    (`python -m venv`, `pip install -e <repo>`) when the cache has none for this key. A lock
    keeps two runs from building it at once. Raises RuntimeError with pip's words if the build
    fails (e.g. no package index)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    venv = cache_dir / PLAIN_VENV
    python = venv / "bin" / "python"
    pins = installed_pins()
    key = venv_key(pins)
    with open(cache_dir / f"{PLAIN_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cached_venv_python(cache_dir) is not None:
            return python
        print(f"building {venv} (no otel extra; once per pyproject.toml) ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        for command in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "-q", "-e", str(REPO_ROOT), *pins],
        ):
            done = subprocess.run(
                command,
                check=False,
                capture_output=True,
                text=True,
                timeout=VENV_BUILD_DEADLINE_S,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        (venv / VENV_KEY_FILE).write_text(key)
    return python


def cached_venv_python(cache_dir: Path = CACHE_DIR) -> Path | None:
    """The python of the cached venv when it was finished for this pyproject.toml; else None."""
    venv = cache_dir / PLAIN_VENV
    try:
        finished = (venv / VENV_KEY_FILE).read_text() == venv_key(installed_pins())
    except OSError:
        return None
    python = venv / "bin" / "python"
    return python if finished and python.exists() else None


def probe(python: str) -> dict[str, Any]:
    """Where `python`, run as the node is (`-m` from the repository root), finds dex_ha, and
    whether it can import OpenTelemetry's SDK and OTLP exporter."""
    script = (
        "import importlib.util, json, dex_ha; from dex_ha.server import tracing; "
        "print(json.dumps({'dex_ha': dex_ha.__file__, "
        "'opentelemetry': importlib.util.find_spec('opentelemetry') is not None, "
        "'exporter': tracing.OTLPSpanExporter is not None}))"
    )
    done = subprocess.run(
        [python, "-c", script],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=CHECK_DEADLINE_S,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} cannot import dex_ha: {done.stderr.strip()[-2000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def check_configs(plain_python: Path) -> dict[str, Any]:
    """A's python runs this checkout without OpenTelemetry; this one has the extra."""
    plain, extra = probe(str(plain_python)), probe(sys.executable)
    for name, found in (("the venv without the extra", plain), ("this interpreter", extra)):
        if not Path(found["dex_ha"]).resolve().is_relative_to(REPO_ROOT):
            raise RuntimeError(f"{name} imports dex_ha from {found['dex_ha']}, not from {REPO_ROOT}")
    if plain["opentelemetry"]:
        raise RuntimeError(f"{plain_python} has `opentelemetry` installed: it is not a venv without the extra")
    if not extra["exporter"]:
        raise RuntimeError(
            f"{sys.executable} lacks the otel extra (OpenTelemetry SDK and OTLP exporter): "
            f"pip install -e '{REPO_ROOT}[otel]'"
        )
    return {"plain_python": str(plain_python), "plain": plain, "extra_python": sys.executable, "extra": extra}


def configs(plain_python: Path, receiver_url: str) -> list[Config]:
    base = dict(os.environ)  # without OTEL_* (see main)
    return [
        Config("A", "no extra", str(plain_python), base, False),
        Config("B", "extra, off", sys.executable, base, False),
        Config("C", "extra, exporting", sys.executable, {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url}, True),
    ]


# ---------------------------------------------------------------- the run


async def measure_config(
    config: Config,
    args: argparse.Namespace,
    root: Path,
    registry: steps_bench.ProcessRegistry,
    receiver: Any,
    round_index: int,
) -> dict[str, Any]:
    """One row: a fresh node of `config`, measured at `args.concurrency`, then stopped (its
    last spans flushed); with the exports the receiver got meanwhile."""
    root.mkdir(parents=True)
    exports_before = receiver.requests
    bytes_before = receiver.bytes_received
    deployment = await steps_bench.start_dev(root, registry, config.python, config.env)
    try:
        row = await steps_bench.measure(deployment, args.concurrency, args, root, registry, round_index)
    finally:
        leftovers = await asyncio.to_thread(deployment.stop)
    exports = receiver.requests - exports_before
    if config.exports and exports == 0:
        raise RuntimeError(f"config {config.name} ({config.label}) sent no trace export: tracing was not on")
    if not config.exports and exports:
        raise RuntimeError(f"config {config.name} ({config.label}) sent {exports} trace exports: tracing was on")
    return {
        "config": config.name,
        "label": config.label,
        "python": config.python,
        "command": deployment.command,
        "node_pid": deployment.node_pids[0],
        "node_killed_after_deadline": leftovers,
        "otlp_exports": exports,
        "otlp_bytes": receiver.bytes_received - bytes_before,
        **asdict(row),
    }


METRICS = ("steps_per_second", "p50_ms", "server_cpu_ms_per_step", "worker_cpu_ms_per_step")


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per configuration: the median of each metric over the rounds, and the median over the
    rounds of its ratio to A of the same round."""
    summary: dict[str, dict[str, float | None]] = {}
    a_of_round = {r["round"]: r for r in rows if r["config"] == "A"}
    for name in sorted({r["config"] for r in rows}):
        mine = [r for r in rows if r["config"] == name]
        entry: dict[str, float | None] = {}
        for metric in METRICS:
            values = [r[metric] for r in mine if r[metric] is not None]
            entry[metric] = round(statistics.median(values), 3) if values else None
            ratios = [
                q
                for r in mine
                if r["round"] in a_of_round and (q := ratio(r[metric], a_of_round[r["round"]][metric], 3)) is not None
            ]
            entry[f"{metric}_vs_A"] = round(statistics.median(ratios), 3) if ratios else None
        summary[name] = entry
    return summary


async def main_async(args: argparse.Namespace, registry: steps_bench.ProcessRegistry) -> dict[str, Any]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # stop like Ctrl-C
    # Imported here: it needs opentelemetry-proto (part of the extra), which check_configs
    # has just found, or explained the lack of.
    from harness.otlp_receiver import OtlpReceiver

    plain_python = await asyncio.to_thread(plain_venv, args.cache_dir)
    checked = await asyncio.to_thread(check_configs, plain_python)
    receiver = OtlpReceiver(keep_spans=False)
    await receiver.start()
    result: dict[str, Any] = {
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "rounds": args.rounds,
        "turns_per_session": args.turns_per_session,
        "cores": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "interpreters": checked,
        "plain_venv_pins": installed_pins(),
        "rows": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="dex-tracing-cost-") as tmp:
            for round_index in range(args.rounds):
                for config in configs(plain_python, receiver.url):
                    print(
                        f"round {round_index + 1}/{args.rounds}, {config.name} ({config.label}): c={args.concurrency}, "
                        f"warm-up of at least {args.warmup_s:g} s + {args.duration_s:g} s ...",
                        flush=True,
                    )
                    root = Path(tmp) / f"{config.name}-{round_index}"
                    row = await measure_config(config, args, root, registry, receiver, round_index)
                    result["rows"].append(row)
                    print(
                        f"  {row['steps_per_second']:.0f} steps/s, p50 {fmt(row['p50_ms'], '.2f')} ms, "
                        f"node {fmt(row['server_cpu_ms_per_step'], '.3f')} ms/step, {row['otlp_exports']} exports",
                        flush=True,
                    )
    finally:
        await receiver.stop()
    result["summary"] = summarize(result["rows"])
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nThe cost of tracing: `dex-ha dev` (strict), c={result['concurrency']}, {result['duration_s']:g} s windows, "
        f"{result['rounds']} round(s), rows interleaved A B C; {result['cores']} cores, load average at start "
        f"{result['load_average_at_start'][0]:.1f}"
    )
    print("A = no otel extra (venv), B = extra installed, no endpoint, C = extra, exporting to a local receiver")
    header = f"{'config':<20} {'round':>5} {'steps/s':>8} {'p50 ms':>7} {'srv ms/step':>11} {'exports':>8}"
    print(header)
    for r in result["rows"]:
        print(
            f"{r['config'] + ' ' + r['label']:<20} {r['round'] + 1:>5} {r['steps_per_second']:>8.0f} "
            f"{fmt(r['p50_ms'], '.2f'):>7} {fmt(r['server_cpu_ms_per_step'], '.3f'):>11} {r['otlp_exports']:>8}"
        )
    print(f"\nmedian of {result['rounds']} round(s); ratios to A are per round (X / A of the same round), their median")
    print(
        f"{'config':<20} {'steps/s':>8} {'p50 ms':>7} {'srv ms/step':>11} {'steps/s vs A':>12} {'p50 vs A':>9} "
        f"{'srv CPU vs A':>12}"
    )
    labels = {r["config"]: r["label"] for r in result["rows"]}
    for name, s in result["summary"].items():
        print(
            f"{name + ' ' + labels[name]:<20} {fmt(s['steps_per_second'], '.0f'):>8} {fmt(s['p50_ms'], '.2f'):>7} "
            f"{fmt(s['server_cpu_ms_per_step'], '.3f'):>11} {fmt(s['steps_per_second_vs_A'], '.3f'):>12} "
            f"{fmt(s['p50_ms_vs_A'], '.3f'):>9} {fmt(s['server_cpu_ms_per_step_vs_A'], '.3f'):>12}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent sessions in every row (default 64)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="measured seconds per row (default 20)")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="least unmeasured seconds before a window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of A B C (default 3)")
    parser.add_argument("--turns-per-session", type=int, default=10, help="turns queued in each session")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"c={QUICK['concurrency']}, {QUICK['duration_s']:g} s windows, {QUICK['rounds']} round "
        "(overrides those three flags)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=CACHE_DIR,
        help=f"where the venv without the extra is kept (default {CACHE_DIR})",
    )
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    if args.concurrency < 1 or args.duration_s <= 0 or args.warmup_s < 0 or args.rounds < 1:
        parser.error("--concurrency >= 1, --duration-s > 0, --warmup-s >= 0, --rounds >= 1")
    if args.turns_per_session < 1:
        parser.error("--turns-per-session >= 1")
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[name]  # the Worker processes inherit this environment, and so does A's and B's node
    if importlib.util.find_spec("opentelemetry.proto") is None:
        parser.exit(2, f"the otel extra is not installed in {sys.executable}: pip install -e '{REPO_ROOT}[otel]'\n")
    try:
        result = steps_bench.run_stopping_every_process(lambda registry: main_async(args, registry))
    except RuntimeError as exc:
        print(f"tracing_cost_bench: {exc}", file=sys.stderr)
        return 1
    if result is None:
        return 130
    print_table(result)
    print(f"\nwrote {steps_bench.write_json(result, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
