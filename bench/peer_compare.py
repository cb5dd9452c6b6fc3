"""Side by side with the peer, SkyRL's Tinker server (skyrl 0.4.0, JAX backend, its tuned config), on this machine.

    python bench/peer_compare.py [--scratch /work/peer-scratch] [--models tiny,small] [--repeats 3] [--probes]
    python bench/peer_compare.py --servers ours,preload --preload /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4

For each model and repeat, the peer and our server run one after the other (the order alternates between
repeats, so load from elsewhere hits both): launch, the same client (`bench/peer/bench_client.py`, tinker SDK
0.25), stop. Ours is launched as a user would: `serve run` on a generated serve_config.yaml in the scratch dir,
bound to 127.0.0.1, with the Qwen3 model folder as its only base model, in a Ray instance of its own
(RAY_TMPDIR under /tmp); Ctrl-C stops it. Prints the table of per-row medians and ratios and the machine, and
writes everything to bench/results/peer_compare-<time>.json. The peer and the two Qwen3 test models must be in
the scratch dir (`make bench-peer` installs and builds them when missing).

`--servers ours,preload` compares our server with itself run under `LD_PRELOAD=<--preload>` (every Ray process
inherits it), in the same way: vLLM's CPU advice to preload tcmalloc, measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deployments import serve_env  # noqa: E402

HERE = ROOT / "bench" / "peer"
# skyrl-cpu.md's tuned JAX backend: 8 adapter slots at rank 8, micro-batches of 8, samples padded to 32 sequences
PEER_BACKEND = {"max_lora_adapters": 8, "max_lora_rank": 8, "train_micro_batch_size": 8, "sample_max_num_sequences": 32}
OUR_MAX_LORA_RANK = 8  # the peer's tuned adapter width (vLLM pads every adapter to max_lora_rank)
SERVERS = ("peer", "ours", "preload")  # preload: ours with LD_PRELOAD=--preload
LABELS = {"peer": "SkyRL", "ours": "ours", "preload": "preloaded"}
# (row, path in the client's JSON, unit, True when higher is better)
ROWS: list[tuple[str, tuple[str, ...], str, bool]] = [
    ("median train step 8x64 (fwd_bwd+optim)", ("train", "median_step_s"), "s", False),
    ("warm sampling (8 prompts x 4 x 32 tok)", ("sample_warm", "tokens_per_s"), "tok/s", True),
    ("cold sampling (first round, 1024 tok)", ("sample_cold", "wall_s"), "s", False),
    ("save_weights_and_get_sampling_client", ("save_weights_and_get_sampling_client_s",), "s", False),
    ("one 1x32-token request", ("sample_single_s",), "s", False),
    ("get_info round trip (median)", ("get_info_rtt_ms_median",), "ms", False),
    ("healthz round trip (median)", ("healthz_rtt_ms_median",), "ms", False),
    ("launch -> first model created", ("create_model_done_since_launch_s",), "s", False),
]

# Issue 33's targets: (row, "ratio" of ours / SkyRL or "ours" alone, bound, True when the figure must be at most it)
TARGETS: list[tuple[str, str, float, bool]] = [
    ("median train step 8x64 (fwd_bwd+optim)", "ratio", 0.5, True),
    ("warm sampling (8 prompts x 4 x 32 tok)", "ratio", 1.0, False),
    ("get_info round trip (median)", "ratio", 1.0, True),
    ("healthz round trip (median)", "ours", 1.0, True),
    ("launch -> first model created", "ratio", 1.3, True),
]


def log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait_for(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until `url` answers 200; raises if the server exits first or takes longer than `timeout`."""
    start = time.time()
    while not http_ok(url):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}) before {url} answered")
        if time.time() - start > timeout:
            raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.2)
    return time.time() - start


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a pid from a later process that reuses it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def our_processes(root: int, marker: str) -> dict[int, str | None]:
    """`root` and its descendants, plus live processes whose command line holds `marker` (our run's own Ray temp
    dir or database): every process of this run, and no one else's."""
    found: dict[int, str | None] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid not in found and (start := started_at(pid)):
            found[pid] = start
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    stack += [int(c) for c in (task / "children").read_text().split()]
    for entry in Path("/proc").glob("[0-9]*"):
        if int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.setdefault(int(entry.name), started_at(int(entry.name)))
    return found


def launch_peer(scratch: Path, model: Path, port: int, run: Path) -> subprocess.Popen[bytes]:
    """skyrl.tinker.api through the uv shim, as skyrl-cpu.md documents (the shim reads $PEER)."""
    env = {
        **os.environ,
        "PEER": str(scratch),
        "PATH": f"{HERE / 'shim'}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "JAX_PLATFORMS": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [str(HERE / "shim" / "uv"), "run", "-m", "skyrl.tinker.api", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--base-model", str(model), "--backend", "jax", "--backend-config", json.dumps(PEER_BACKEND)]
    cmd += ["--database-url", f"sqlite:///{run}/tinker.db", "--checkpoints-base", f"{run}/ckpt"]
    return subprocess.Popen(cmd, cwd=run, env=env, stdout=(run / "server.log").open("wb"), stderr=subprocess.STDOUT)


def our_config(model: Path, run: Path) -> dict[str, Any]:
    """serve_config.yaml with the Qwen3 folder as the one base model (named by its path, as the client asks for it),
    the state in the run dir and the peer's adapter width; trainer and sampler shapes as the repo's default."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = config["applications"][0]["args"]
    base = args["base_models"][0]
    base.pop("embedded_preset", None)
    base.update(name=str(model), path=str(model))
    args["state_dir"] = str(run / "state")
    args.setdefault("engine", {})["max_lora_rank"] = OUR_MAX_LORA_RANK
    return config


def serve_run(
    config: dict[str, Any], port: int, run: Path, ray_tmp: Path, preload: str | None = None
) -> subprocess.Popen[bytes]:
    """`serve run --address local` on `config` (written to the run dir), in a fresh Ray instance under `ray_tmp`,
    with `make serve`'s Serve settings: the Ingress replica answers on 127.0.0.1:`port` itself, Serve's proxy on a
    free port. `preload`: a library every process of it loads first (LD_PRELOAD)."""
    config = {**config, "http_options": {"host": "127.0.0.1", "port": free_port()}}
    (run / "serve_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    ray_tmp.mkdir(parents=True)
    env = {
        **os.environ,
        **serve_env.single_node(port),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_AUTH_MODE": "disabled",
        "RAY_TRAIN_V2_ENABLED": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if preload:
        env["LD_PRELOAD"] = preload
    env.pop("RAY_ADDRESS", None)
    serve = Path(sys.executable).parent / "serve"
    cmd = [str(serve), "run", "--address", "local", "--app-dir", str(ROOT), str(run / "serve_config.yaml")]
    log_file = (run / "server.log").open("wb")
    # Ctrl-C stops `serve run` cleanly; a shell that runs us in the background passes SIGINT on as ignored
    return subprocess.Popen(
        cmd, cwd=run, env=env, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_default_sigint
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen[bytes], sig: int, grace: float, marker: str) -> list[int]:
    """Signal the server and wait; then kill whatever of its processes is left. Returns the pids that had to be
    killed (none when it shut down cleanly)."""
    processes = our_processes(proc.pid, marker)
    for signum in (sig, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None:
            proc.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
    deadline = time.time() + 15
    while (left := [p for p, t in processes.items() if t and started_at(p) == t]) and time.time() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def run_client(args: argparse.Namespace, url: str, model: Path, pid: int, t0: float, label: str, run: Path) -> dict:
    """bench_client.py against `url`; its last stdout line is its JSON result."""
    cmd = [args.client_python, str(HERE / "bench_client.py"), "--base-url", url, "--model", str(model)]
    cmd += ["--pids", str(pid), "--launch-t0", str(t0), "--label", label]
    if not args.probes:
        cmd.append("--skip-probes")
    with (run / "client.err").open("wb") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=args.client_timeout, check=False)
    lines = done.stdout.decode().strip().splitlines()
    (run / "client.json").write_text(lines[-1] if lines else "{}")
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, json.JSONDecodeError):
        return {"fatal": f"client exited {done.returncode} without a result (see {run / 'client.err'})"}


def one_run(args: argparse.Namespace, server: str, name: str, repeat: int) -> dict:
    """Launch one server on one model, run the client, stop it; the client's result plus start-up figures."""
    model = args.scratch / "models" / name
    run = args.scratch / "compare" / f"{server}-{name}-{repeat}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ray_tmp = Path(f"/tmp/tspeer-{os.getpid()}-{server}-{name}-{repeat}")  # short: Ray's socket paths are bounded
    log(f"{server} {name} #{repeat}: launching on {url} ({run})")
    t0 = time.time()
    if server == "peer":
        proc = launch_peer(args.scratch, model, port, run)
    else:
        proc = serve_run(our_config(model, run), port, run, ray_tmp, args.preload if server == "preload" else None)
    result: dict[str, Any] = {}
    try:
        result["healthz_after_s"] = round(wait_for(f"{url}/api/v1/healthz", proc, args.start_timeout), 2)
        log(f"{server} {name} #{repeat}: up after {time.time() - t0:.1f} s; running the client")
        result.update(run_client(args, url, model, proc.pid, t0, f"{server}-{name}", run))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result["fatal"] = str(exc)
    finally:
        stopping = time.time()
        if server == "peer":  # SIGTERM to the shim takes down the API and the engine
            killed = stop(proc, signal.SIGTERM, 30, f"--database-url sqlite:///{run}/")
        else:  # Ctrl-C: serve run shuts Serve down, then its Ray instance
            killed = stop(proc, signal.SIGINT, 60, str(ray_tmp))
            shutil.rmtree(ray_tmp, ignore_errors=True)
    result["stop_s"] = round(time.time() - stopping, 1)
    result["killed_leftovers"] = killed
    result["run_dir"] = str(run)
    log(f"{server} {name} #{repeat}: {summary(result)}" + (f"; killed leftovers {killed}" if killed else ""))
    return result


def figure(result: dict, path: tuple[str, ...]) -> float | None:
    value: Any = result
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def summary(result: dict) -> str:
    if "fatal" in result:
        return "FAILED: " + str(result["fatal"])
    return ", ".join(f"{row.split(' (')[0]} {figure(result, path)} {unit}" for row, path, unit, _ in ROWS)


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def medians(
    runs: dict[str, dict[str, list[dict]]], base: str, other: str
) -> dict[str, dict[str, dict[str, float | None]]]:
    """{model: {row: {"base": median, "other": median, "ratio": other / base}}}."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, by_server in runs.items():
        out[name] = {}
        for row, path, _, _ in ROWS:
            first = median([figure(r, path) for r in by_server[base]])
            second = median([figure(r, path) for r in by_server[other]])
            ratio = second / first if first and second is not None else None
            out[name][row] = {"base": first, "other": second, "ratio": ratio}
    return out


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def table(meds: dict[str, dict[str, dict[str, float | None]]], repeats: int, base: str, other: str) -> str:
    """Markdown: one row per figure, the base server and the other (with other / base) per model."""
    names, b, o = list(meds), LABELS[base], LABELS[other]
    head = "| median of " + str(repeats) + " | " + " | ".join(f"{b} {n} | {o} {n} ({o}/{b})" for n in names)
    lines = [head + " |", "|---" * (1 + 2 * len(names)) + "|"]
    for row, _, unit, higher in ROWS:
        cells = [f"{row}, {unit} ({'higher' if higher else 'lower'} is better)"]
        for n in names:
            m = meds[n][row]
            ratio = f" ({m['ratio']:.2f}x)" if m["ratio"] is not None else ""
            cells += [fmt(m["base"]), fmt(m["other"]) + ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(meds: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """One line per target and model: the figure, the bound, met or NOT met."""
    lines = []
    for row, kind, bound, at_most in TARGETS:
        for name, rows in meds.items():
            value = rows[row]["other" if kind == "ours" else kind]
            met = value is not None and (value <= bound if at_most else value >= bound)
            what = "ours / SkyRL" if kind == "ratio" else "ours"
            sign = "<=" if at_most else ">="
            lines.append(
                f"target {row.split(' (')[0]}, {name}: {what} {fmt(value)} {sign} {bound}: "
                f"{'met' if met else 'NOT met'}"
            )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    mem = next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(int(mem) / 2**20, 1),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scratch", type=Path, default=Path(os.environ.get("PEER", "/work/peer-scratch")))
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--servers", default="peer,ours", help="the base server, then the one compared with it")
    ap.add_argument("--preload", default=None, help="LD_PRELOAD of the 'preload' server (e.g. tcmalloc)")
    ap.add_argument("--probes", action="store_true", help="also run the client's feature probes (slower)")
    ap.add_argument("--client-python", default=None, help="default: the peer venv's python (tinker SDK 0.25)")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--client-timeout", type=float, default=1200.0)
    args = ap.parse_args()
    args.scratch = args.scratch.resolve()
    args.client_python = args.client_python or str(args.scratch / "venv" / "bin" / "python")
    servers = [s for s in args.servers.split(",") if s in SERVERS]
    if len(servers) != 2 or ("preload" in servers) != bool(args.preload):
        sys.exit(f"--servers names two of {SERVERS}; 'preload' goes with --preload LIB")
    names = args.models.split(",")
    for name in names:
        if not (args.scratch / "models" / name / "config.json").exists():
            sys.exit(f"no model at {args.scratch / 'models' / name}: run bench/peer/build_models.py (make bench-peer)")
    started, before = time.strftime("%Y-%m-%d %H:%M:%S %Z"), machine()
    log(f"machine: {before}")
    runs: dict[str, dict[str, list[dict]]] = {n: {s: [] for s in SERVERS} for n in names}
    for repeat in range(args.repeats):
        for name in names:
            order = servers if repeat % 2 == 0 else servers[::-1]
            for server in order:
                runs[name][server].append(one_run(args, server, name, repeat))
    meds = medians(runs, *servers)
    after = machine()
    text = table(meds, args.repeats, *servers)
    print(text)
    if servers == ["peer", "ours"]:
        print("\n" + targets(meds))
    print(
        f"\n{started}; {before['nproc']} cores ({before['cpu']}), {before['mem_gib']} GiB; load average before "
        f"{'/'.join(f'{x:.2f}' for x in before['loadavg'])}, after {'/'.join(f'{x:.2f}' for x in after['loadavg'])}"
    )
    out = ROOT / "bench" / "results" / f"peer_compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": started,
        "machine_before": before,
        "machine_after": after,
        "peer_backend": PEER_BACKEND,
    }
    report |= {"our_max_lora_rank": OUR_MAX_LORA_RANK, "repeats": args.repeats, "servers": servers}
    report |= {"preload": args.preload, "medians": meds, "table": text}
    report["runs"] = runs
    out.write_text(json.dumps(report, indent=1))
    log(f"results: {out}")


if __name__ == "__main__":
    main()
