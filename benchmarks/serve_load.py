"""``workbench serve`` under load on the loopback: latency, throughput, and no response lost, duplicated or crossed.

A real server (``workbench serve`` in a subprocess, uvicorn on a free loopback port) answers a ptbxl run (by default a
fresh one: ``workbench adapt --domain ptbxl --method readout --epochs 1 --baselines ""`` on the embedded data; the
model is the same whatever the method, so its size is the shipped model's). After 2 s of warm-up (not reported),
clients keep ``concurrency`` requests in flight for ``--seconds`` each (one asyncio loop, httpx; each client sends
the embedded records in turn, a record's header and signal as one multipart upload), at concurrency 1, 8 and 32.
Reported per level: requests answered, throughput [requests/s], latency p50 and p99 [ms] (from the request's start
to its full response), and the checks:

- lost: requests without a 200 answer (an error, a refusal, a timeout);
- duplicated: request ids answered more than once;
- crossed: answers whose ``input_sha256`` is not the hash of what that request sent, or whose record is not the one
  sent;
- audit: request ids without exactly one audit line whose input hash matches, and audit lines of no request; then
  ``workbench audit verify`` on the whole log, against the signed heads the server wrote.

Client and server share the machine (on 2 cores the client's own CPU time is part of what is measured): the numbers
are this machine's, not a claim about another one, so they are printed and kept in the results file, not rendered
into the documentation.

    python benchmarks/serve_load.py                      # 3 × 60 s after a ~30 s run (2 cores)
    python benchmarks/serve_load.py --seconds 10 --run runs/x --levels 1,8

Results: ``benchmarks/results/serve_load.json`` (``levels``: one row per concurrency; ``machine``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

RESULTS = Path(__file__).resolve().parent / "results" / "serve_load.json"
LEVELS = (1, 8, 32)


@dataclass(frozen=True)
class Server:
    """A running ``workbench serve``: its base ``url``, a valid ``token``, its ``audit`` log and ``process``."""

    url: str
    token: str
    audit: Path
    process: subprocess.Popen


def make_run(out: Path) -> Path:
    """A finished ptbxl run in ``out`` (one epoch of the readout on the embedded data, no baselines)."""
    command = [sys.executable, "-m", "workbench", "adapt", "--domain", "ptbxl", "--method", "readout", "--epochs",
               "1", "--baselines", "", "--quiet", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(run: Path, folder: Path, *flags: str, audit: Path | None = None,
                   start_timeout_s: float = 120.0) -> Iterator[Server]:  # fmt: skip
    """``workbench serve --run RUN`` on a free loopback port with a fresh token (files in ``folder``), once its
    ``/health`` answers; stopped (SIGTERM, then SIGKILL after 30 s) on leaving, unless already ended."""
    import secrets

    import httpx

    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe()
    tokens = folder / "tokens.txt"
    tokens.write_text(f"load-test {token}\n")
    tokens.chmod(0o600)
    audit = audit or folder / "audit.jsonl"
    port = free_port()
    command = [sys.executable, "-m", "workbench", "serve", "--run", str(run), "--port", str(port), "--token-file",
               str(tokens), "--audit-log", str(audit), *flags]  # fmt: skip
    log = open(folder / f"server-{port}.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"workbench serve exited ({process.returncode}): {(folder / log.name).read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"workbench serve did not answer /health within {start_timeout_s:g} s")
            time.sleep(0.2)
        yield Server(url, token, audit, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def embedded_records(count: int) -> list[dict[str, Any]]:
    """The first ``count`` embedded ptbxl records: ``{"name", "files": {file name: bytes}, "sha256"}``, the hash as
    the server computes it (`workbench.serve.uploads.input_sha256`, which the test checks against ``sha256sum``)."""
    from workbench.domains.ecg.readers import EMBEDDED_PTBXL

    from workbench.serve.uploads import input_sha256

    found = []
    for header in sorted((EMBEDDED_PTBXL / "records100").rglob("*.hea"))[:count]:
        files = {path.name: path.read_bytes() for path in (header, header.with_suffix(".dat"))}
        digests = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
        found.append({"name": header.stem, "files": files, "sha256": input_sha256(digests)})
    return found


async def _level(server: Server, records: list[dict[str, Any]], concurrency: int, seconds: float) -> list[dict]:
    import httpx

    outcomes: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120, headers=headers) as client:

        async def worker(index: int) -> None:
            turn = index
            while time.monotonic() < deadline:
                record = records[turn % len(records)]
                turn += concurrency
                files = [("file", (name, content)) for name, content in record["files"].items()]
                started = time.perf_counter()
                outcome: dict[str, Any] = {"record": record["name"], "sent_sha256": record["sha256"]}
                try:
                    response = await client.post("/predict", files=files)
                    outcome["status"] = response.status_code
                    body = response.json()
                    outcome["request_id"] = body.get("request_id")
                    outcome["got_sha256"] = body.get("input_sha256")
                    outcome["got_records"] = [r.get("record") for r in body.get("results") or []]
                except Exception as error:  # a lost request: counted, never hidden
                    outcome["status"], outcome["error"] = None, repr(error)
                outcome["seconds"] = time.perf_counter() - started
                outcomes.append(outcome)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return outcomes


def load_level(server: Server, records: list[dict[str, Any]], concurrency: int, seconds: float) -> dict[str, Any]:
    """``concurrency`` clients sending ``records`` in turn for ``seconds``; the level's row (`check` included) and
    its ``outcomes`` (one dict per request)."""
    audit_before = _audit_lines(server.audit)
    started = time.perf_counter()
    outcomes = asyncio.run(_level(server, records, concurrency, seconds))
    wall = time.perf_counter() - started
    answered = [o for o in outcomes if o["status"] == 200]
    latencies = sorted(o["seconds"] for o in answered)
    row = {
        "concurrency": concurrency,
        "seconds": round(wall, 2),
        "requests": len(outcomes),
        "answered": len(answered),
        "throughput_per_s": len(answered) / wall,
        "p50_ms": 1000 * _quantile(latencies, 0.50) if latencies else None,
        "p99_ms": 1000 * _quantile(latencies, 0.99) if latencies else None,
        **check(outcomes, _audit_lines(server.audit)[len(audit_before) :]),
    }
    return {"row": row, "outcomes": outcomes}


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (linear interpolation, numpy's default)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def _audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def check(outcomes: list[dict[str, Any]], audit: list[dict[str, Any]]) -> dict[str, int]:
    """Counts of lost, duplicated and crossed answers, and of audit mismatches (see the module docstring)."""
    ids = [o["request_id"] for o in outcomes if o.get("status") == 200]
    crossed = sum(1 for o in outcomes if o.get("status") == 200
                  and (o["got_sha256"] != o["sent_sha256"] or o["got_records"] != [o["record"]]))  # fmt: skip
    lines: dict[str, list[dict[str, Any]]] = {}
    for line in audit:
        lines.setdefault(line["request_id"], []).append(line)
    sent = {o["request_id"]: o for o in outcomes if o.get("request_id")}
    mismatched = sum(1 for rid, o in sent.items() if len(lines.get(rid, [])) != 1
                     or lines[rid][0]["input_sha256"] != o["sent_sha256"])  # fmt: skip
    return {
        "lost": sum(1 for o in outcomes if o.get("status") != 200),
        "duplicated": len(ids) - len(set(ids)),
        "crossed": crossed,
        "audit_mismatches": mismatched + sum(1 for rid in lines if rid not in sent),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'concurrency':>11} {'requests':>8} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'lost':>5} {'dup':>4} "
            f"{'crossed':>7} {'audit':>5}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['concurrency']:>11} {r['requests']:>8} {r['throughput_per_s']:>7.1f} {r['p50_ms']:>8.0f} "
                     f"{r['p99_ms']:>8.0f} {r['lost']:>5} {r['duplicated']:>4} {r['crossed']:>7} "
                     f"{r['audit_mismatches']:>5}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, help="a finished ptbxl run to serve (default: make one)")
    parser.add_argument("--seconds", type=float, default=60.0, help="duration of each level (default: 60)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (default: 1,8,32)")
    parser.add_argument("--records", type=int, default=24, help="distinct embedded records sent (default: 24)")
    parser.add_argument("--no-results", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="serve-load-") as scratch:
        folder = Path(scratch)
        run = args.run or make_run(folder / "run")
        records = embedded_records(args.records)
        rows = []
        with running_server(run, folder / "server") as server:
            load_level(server, records, 1, 2.0)  # warm-up (first requests load lazily): not reported
            for level in levels:
                rows.append(load_level(server, records, level, args.seconds)["row"])
                print(table(rows[-1:]).splitlines()[-1], flush=True)
            server.process.send_signal(signal.SIGTERM)
            server.process.wait(60)
            heads = f"{server.audit}.heads.jsonl"  # the server's signed heads (workbench serve --audit-heads)
            verified = subprocess.run([sys.executable, "-m", "workbench", "audit", "verify", str(server.audit),
                                       "--since-checkpoint", heads], capture_output=True, text=True)  # fmt: skip
    print(table(rows))
    print(f"audit verify: exit {verified.returncode}: {(verified.stdout or verified.stderr).strip()}")
    if not args.no_results:
        from workbench.core.checkpoint import write_json

        write_json(RESULTS, {
            "benchmark": "serve_load",
            "run": str(args.run) if args.run else "fresh: workbench adapt --domain ptbxl --method readout --epochs 1",
            "seconds_per_level": args.seconds,
            "records": args.records,
            "levels": rows,
            "audit_verify_exit": verified.returncode,
            "server_exit": server.process.returncode,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "load_average_at_end": os.getloadavg()},  # fmt: skip
        })  # fmt: skip
    clean = all(r["lost"] == r["duplicated"] == r["crossed"] == r["audit_mismatches"] == 0 for r in rows)
    return 0 if clean and verified.returncode == 0 and server.process.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
