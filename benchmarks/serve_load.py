"""Serve under load (issue 28's server targets): a real ``prism serve MODEL --parallel 4`` process on
127.0.0.1, started here and stopped at the end, per backend:

1. ``CLIENTS`` concurrent clients (threads with httpx, in this process) for ``--serve-seconds`` (default 60),
   each asking /v1/completions again and again for ``MAX_TOKENS`` greedy tokens (temperature 0) over a few
   prompts, streamed and not in turn. Reported: requests done and failed, the aggregate tokens/s through
   the server beside the engine's own aggregate under the same load (the same clients submitting straight
   to an :class:`~prism_core.models.engine.Engine` of the same parallelism, in a fresh interpreter, before
   the server starts), the server's overhead per token as a fraction of the engine's time per token
   (engine tok/s / server tok/s - 1; target < 10%), and per prompt whether every output (server and
   direct engine) equals the prompt's solo greedy output (``model.generate`` alone), else the first
   differing token position. Both runs start with a warm-up round (graphs planned, kernels compiled) and
   count the tokens of requests that ended, over the seconds until the last one ended.
2. Time to first token of a streamed request to the idle server (after the load, so its graphs are
   planned), against ``prism run MODEL -p PROMPT --json``'s prompt seconds (a fresh process: kernels'
   compiling excluded, the prompt graph's planning included), for a short and a longer prompt
   (target < 1.2x); and, stricter, against the solo prompt seconds of ``model.generate`` with the prompt's
   graph already planned (as the idle server's is), measured in the engine's interpreter.

The clients share the machine with the server: on 2 cores, their HTTP work takes time the server would
otherwise have.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

from .model import THREADS, _env

PARALLEL = 4
CLIENTS = 16
MAX_TOKENS = 64
SERVE_SECONDS = 60.0
WARMUP_SECONDS = 5.0
PROMPTS = ("The capital of France is", "Water boils at", "1, 2, 3, 4,", "Once upon a time",
           "def fib(n):", "The best way to learn")
TTFT_PROMPTS = {"short": "The capital of France is",
                "long": " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 8)}
START_TIMEOUT_S = 300.0

# One backend's engine side, in its own interpreter (the server's environment): the solo greedy outputs
# (token ids and pieces), then CLIENTS threads submitting to an Engine for the same duration as the server.
_PROBE = r"""
import json, sys, threading, time
from prism_core.models import Sampler, load
from prism_core.models.engine import Engine
backend, path, parallel, clients, seconds, warmup, max_tokens = sys.argv[1:8]
parallel, clients, max_tokens = int(parallel), int(clients), int(max_tokens)
seconds, warmup = float(seconds), float(warmup)
prompts = json.loads(sys.argv[8])
model = load(path, backend=backend, n_seq=parallel)
solo = {}
for p in prompts:
    toks = list(model.generate(p, max_tokens=max_tokens, sampler=Sampler.greedy()))
    solo[p] = {"ids": [t.id for t in toks], "pieces": [t.text for t in toks]}
warm = {}
for k, p in json.loads(sys.argv[9]).items():  # solo prompt seconds with the graph planned (median of 3)
    times = []
    for _ in range(4):
        list(model.generate(p, max_tokens=1, sampler=Sampler.greedy()))
        times.append(model.timings.prompt_s)
    warm[k] = sorted(times[1:])[1]
print(json.dumps({"solo": solo, "warm_prompt_s": warm}), flush=True)
engine = Engine(model, n_parallel=parallel).start()
def load_for(duration):
    ids = {p: model.encode(p) for p in prompts}
    outs, counts, ends = {}, [0] * clients, []
    t0 = time.perf_counter()
    stop_at = t0 + duration
    def client(i):
        k = i
        while time.perf_counter() < stop_at:
            p = prompts[k % len(prompts)]
            req = engine.submit(ids[p], max_tokens, Sampler.greedy())
            got = [t.id for t in req]
            counts[i] += len(got)
            outs.setdefault(p, set()).add(tuple(got))
            k += 1
        ends.append(time.perf_counter())
    ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in ts: t.start()
    for t in ts: t.join()
    return sum(counts), max(ends) - t0, outs
load_for(warmup)
s0, c0 = engine.stats.generated, engine.stats.compute_s
n, dt, outs = load_for(seconds)
compute = engine.stats.compute_s - c0
engine.close()
print(json.dumps({"engine_tok_s": n / dt, "engine_tokens": n, "engine_s": dt, "engine_compute_s": compute,
                  "engine_outputs": {p: [list(o) for o in v] for p, v in outs.items()}}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_probe(backend: str, path: str, seconds: float) -> dict:
    cmd = [sys.executable, "-c", _PROBE, backend, path, str(PARALLEL), str(CLIENTS), str(seconds),
           str(WARMUP_SECONDS), str(MAX_TOKENS), json.dumps(PROMPTS), json.dumps(TTFT_PROMPTS)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=START_TIMEOUT_S + 4 * seconds + 300)
    out: dict = {}
    for line in p.stdout.splitlines():
        out.update(json.loads(line))
    if p.returncode:
        out["error"] = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    return out


class _Server:
    """``prism serve`` in a child process, stopped (terminate, then kill) on exit."""

    def __init__(self, backend: str, path: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prism_core.cli", "serve", path, "--parallel", str(PARALLEL), "--queue",
             str(CLIENTS), "--backend", backend, "-t", str(THREADS), "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.PIPE, text=True, env=_env())

    def wait_ready(self, client) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prism serve exited ({self.proc.returncode}): {self.proc.stderr.read()[-500:]}")
            try:
                if client.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prism serve did not answer /health within {START_TIMEOUT_S:.0f} s")

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _complete(client, url: str, prompt: str, stream: bool, max_tokens: int = MAX_TOKENS) -> tuple[str, int]:
    """(text, completion tokens) of one greedy /v1/completions request; raises on any failure."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        r = client.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        j = r.json()
        return j["choices"][0]["text"], j["usage"]["completion_tokens"]
    body["stream_options"] = {"include_usage": True}
    parts, n = [], None
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if "error" in j:
                raise RuntimeError(j["error"]["message"])
            if j.get("usage"):
                n = j["usage"]["completion_tokens"]
            for c in j["choices"]:
                parts.append(c["text"])
    if n is None:
        raise RuntimeError("the stream ended without a usage chunk")
    return "".join(parts), n


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux's /proc; -1 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_load(url: str, seconds: float) -> dict:
    """CLIENTS threads, each with its own connection, for ``seconds``; tokens of the requests that ended
    over the seconds until the last ended."""
    import httpx
    outs: dict[str, set[str]] = {}
    counts, done, failed, errors, ends = [0] * CLIENTS, [0] * CLIENTS, [0] * CLIENTS, [], []
    lock = threading.Lock()
    t0 = time.perf_counter()
    stop_at = t0 + seconds

    def client(i: int) -> None:
        k = i
        with httpx.Client() as c:
            while time.perf_counter() < stop_at:
                p = PROMPTS[k % len(PROMPTS)]
                try:
                    text, n = _complete(c, url, p, stream=bool(k % 2))
                except Exception as e:
                    failed[i] += 1
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}"[:200])
                else:
                    counts[i] += n
                    done[i] += 1
                    with lock:
                        outs.setdefault(p, set()).add(text)
                k += 1
        with lock:
            ends.append(time.perf_counter())

    ts = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = max(ends) - t0
    return {"tok_s": sum(counts) / dt, "tokens": sum(counts), "s": dt, "done": sum(done), "failed": sum(failed),
            "errors": errors[:3], "outputs": outs}


def _ttft(url: str, prompt: str, repeats: int = 5) -> float:
    """Median seconds from sending a streamed request to the idle server until its first chunk with text."""
    import httpx
    times = []
    with httpx.Client() as c:
        for _ in range(repeats):
            body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
            t0 = time.perf_counter()
            first = None
            with c.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if first is None and line.startswith("data: {"):
                        if any(ch.get("text") for ch in json.loads(line[6:])["choices"]):
                            first = time.perf_counter() - t0
            times.append(first if first is not None else float("nan"))
    return statistics.median(times)


def _run_prompt_s(backend: str, path: str, prompt: str, repeats: int = 3) -> float:
    """Median of ``prism run``'s own prompt seconds over fresh processes."""
    vals = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-m", "prism_core.cli", "run", path, "-p", prompt, "--backend", backend,
                            "-t", str(THREADS), "--temp", "0", "-n", "1", "--json"],
                           capture_output=True, text=True, env=_env(), timeout=START_TIMEOUT_S)
        if p.returncode:
            raise RuntimeError(f"prism run failed: {p.stderr.strip()[-300:]}")
        vals.append(json.loads(p.stdout.strip().splitlines()[-1])["prompt_s"])
    return statistics.median(vals)


def _first_difference(solo_pieces: list[str], text: str) -> int | None:
    """The index of the first solo token whose piece the text does not continue with (None: equal)."""
    at = 0
    for i, piece in enumerate(solo_pieces):
        if text[at:at + len(piece)] != piece:
            return i
        at += len(piece)
    return None if at == len(text) else len(solo_pieces)


def _agreement(solo: dict, server_outs: dict, engine_outs: dict) -> list[str]:
    lines = []
    for p in PROMPTS:
        s = solo[p]
        srv = server_outs.get(p, set())
        eng = [list(o) for o in engine_outs.get(p, [])]
        bad_srv = sorted(d for d in (_first_difference(s["pieces"], t) for t in srv) if d is not None)
        bad_eng = sorted(next((j for j, (a, b) in enumerate(zip(o, s["ids"])) if a != b), min(len(o), len(s["ids"])))
                         for o in eng if o != s["ids"])
        verdict = (f"server: {len(srv)} distinct output(s), "
                   + ("all equal solo" if not bad_srv else f"{len(bad_srv)} differ, first at token {bad_srv[0]}")
                   + f"; engine: {len(eng)} distinct, "
                   + ("all equal solo" if not bad_eng else f"{len(bad_eng)} differ, first at token {bad_eng[0]}"))
        lines.append(f"    {p!r:<28} {verdict}")
    return lines


def run(bench, backends: list[str], path: str) -> None:
    import httpx
    seconds = bench.serve_seconds or SERVE_SECONDS
    print(f"\n## Serve under load: `prism serve --parallel {PARALLEL}` on 127.0.0.1, {THREADS} threads, "
          f"{CLIENTS} clients x {seconds:.0f} s, {MAX_TOKENS} greedy tokens a request (streamed and not in turn)")
    for backend in backends:
        eng = _engine_probe(backend, path, seconds)
        if "error" in eng or "engine_tok_s" not in eng:
            print(f"  [{backend}] engine probe failed: {eng.get('error', 'no result')}")
            continue
        try:
            with _Server(backend, path) as srv, httpx.Client() as c:
                srv.wait_ready(c)
                for p in PROMPTS:  # warm-up: every prompt's graphs planned
                    _complete(c, srv.url, p, stream=False)
                _server_load(srv.url, WARMUP_SECONDS)
                cpu0, own0 = _cpu_seconds(srv.proc.pid), time.process_time()
                load = _server_load(srv.url, seconds)
                cpu = {"server": _cpu_seconds(srv.proc.pid) - cpu0, "clients": time.process_time() - own0}
                ttft = {k: _ttft(srv.url, p) for k, p in TTFT_PROMPTS.items()}
        except Exception as e:  # a benchmark reports a failed run and goes on
            print(f"  [{backend}] server run failed: {type(e).__name__}: {e}")
            continue
        e_tok_s, s_tok_s = eng["engine_tok_s"], load["tok_s"]
        overhead = e_tok_s / s_tok_s - 1
        print(f"  [{backend}] requests: {load['done']} done, {load['failed']} failed"
              + (f" (e.g. {load['errors'][0]})" if load["errors"] else ""))
        print(f"  [{backend}] aggregate: server {s_tok_s:.1f} tok/s ({load['tokens']} tokens in {load['s']:.1f} s), "
              f"engine directly {e_tok_s:.1f} tok/s ({eng['engine_tokens']} tokens in {eng['engine_s']:.1f} s, "
              f"{eng['engine_compute_s']:.1f} s computing); server overhead per token {overhead:.1%} of the "
              "engine's time per token (target < 10%)")
        if cpu["server"] >= 0:
            print(f"  [{backend}] CPU seconds during the load: server process {cpu['server']:.1f} (engine computing "
                  f"{eng['engine_compute_s']:.1f} s of wall time in its own run), the 16 clients {cpu['clients']:.1f}")
        print(f"  [{backend}] greedy outputs against the prompt's solo greedy output (model.generate alone):")
        print("\n".join(_agreement(eng["solo"], load["outputs"], eng["engine_outputs"])))
        bench.record("serve under load", f"{backend}/server tok/s", s_tok_s)
        bench.record("serve under load", f"{backend}/engine tok/s", e_tok_s)
        bench.record("serve under load", f"{backend}/overhead per token", overhead)
        bench.record("serve under load", f"{backend}/failed requests", load["failed"])
        for k, p in TTFT_PROMPTS.items():
            try:
                run_s = _run_prompt_s(backend, path, p)
            except Exception as e:
                print(f"  [{backend}] prism run failed: {e}")
                continue
            warm = eng["warm_prompt_s"][k]
            print(f"  [{backend}] time to first token, {k} prompt ({len(p)} chars): idle server "
                  f"{ttft[k] * 1e3:.1f} ms; `prism run` prompt {run_s * 1e3:.1f} ms: {ttft[k] / run_s:.2f}x (target "
                  f"< 1.2x); solo prompt with its graph planned (model.generate, as the server's) "
                  f"{warm * 1e3:.1f} ms: {ttft[k] / warm:.2f}x")
            bench.record("serve under load", f"{backend}/ttft {k} / prism run prompt", ttft[k] / run_s)
            bench.record("serve under load", f"{backend}/ttft {k} / warm solo prompt", ttft[k] / warm)
