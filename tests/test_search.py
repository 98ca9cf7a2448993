"""tools/search.py: BM25 over a real corpus (bm25s), HTTP backend against a real local server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from flowgrpo.tools.search import BM25Backend, HTTPSearchBackend, SearchBackend, SearchTool, best_snippet

from flowgrpo.tool import Tool, ToolError, invoke, make_tool

DOCS = [
    {
        "id": "fr",
        "title": "France",
        "text": "France is a country in Europe. Its capital is Paris. It borders Spain.",
    },
    {"id": "de", "title": "Germany", "text": "Germany is a country in Europe. Its capital is Berlin."},
    {
        "id": "eiffel",
        "title": "Eiffel Tower",
        "text": "The Eiffel Tower is a landmark in Paris, built in 1889.",
    },
    {"id": "cat", "title": "Cat", "text": "The cat is a small domesticated carnivorous mammal."},
]


def test_bm25_ranks_and_formats(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n")
    backend = BM25Backend.from_jsonl(path)
    assert isinstance(backend, SearchBackend)
    hits = asyncio.run(backend.search("Eiffel Tower built", 3))
    assert [h.id for h in hits] == ["eiffel"]  # only documents sharing a word score above 0
    hits = asyncio.run(backend.search("capital of Germany", 3))
    assert hits[0].id == "de" and hits[0].title == "Germany"
    assert asyncio.run(backend.search("zebra quantum", 3)) == []

    tool = SearchTool(backend, k=2, max_chars=200)
    assert isinstance(tool, Tool)
    out = asyncio.run(invoke(tool, {"query": "Paris landmark"}))
    assert out.content.startswith(
        "[1] Eiffel Tower\nThe Eiffel Tower is a landmark in Paris, built in 1889.\n\n[2] France"
    )
    assert len(out.content) <= 200
    assert [h["id"] for h in out.artifact] == ["eiffel", "fr"]
    assert asyncio.run(invoke(tool, {"query": "zebra"})).content == "No results for 'zebra'. Try other words."
    with pytest.raises(ToolError, match="empty query"):
        asyncio.run(invoke(tool, {"query": "  "}))


FAKE_JAX_LAX = """
import os
import numpy as np

def top_k(x, k):
    open(os.environ["FAKE_JAX_LOG"], "a").write("top_k\\n")
    idx = np.argsort(-np.asarray(x), axis=-1)[..., :k]
    return np.take_along_axis(np.asarray(x), idx, -1), idx
"""


@pytest.mark.parametrize("chosen", [None, "cuda"])
def test_bm25_keeps_jax_off_the_gpu(tmp_path, chosen):
    """Where JAX is installed, bm25s uses it for top-k, and JAX's first use holds 75% of a GPU's memory
    (six runs side by side on one H200 went out of memory). A stand-in JAX records the platform it was
    imported under and each top-k call: the CPU unless the user chose one, and none from a search."""
    import os
    import subprocess
    import sys

    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text(
        "import os\n"
        "open(os.environ['FAKE_JAX_LOG'], 'a').write('platform ' + os.environ.get('JAX_PLATFORMS', '-') + '\\n')\n"
        "from . import lax\n"
    )
    (tmp_path / "jax" / "lax.py").write_text(FAKE_JAX_LAX)
    log = tmp_path / "jax.log"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(FAKE_JAX_LOG=str(log), PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    if chosen:
        env["JAX_PLATFORMS"] = chosen
    code = (
        "import asyncio, json, sys; from flowgrpo.tools.search import BM25Backend;"
        "b = BM25Backend(json.loads(sys.argv[1]));"
        "print([h.id for h in asyncio.run(b.search('capital of Germany', 2))])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(DOCS)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['de', 'fr']"
    calls = log.read_text().splitlines()
    assert calls[0] == f"platform {chosen or 'cpu'}"
    assert calls.count("top_k") <= 1  # bm25s's probe at import; the search used numpy


def test_from_folder_and_make_tool(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "moon.md").write_text("# The Moon\nThe Moon orbits the Earth every 27 days.")
    (tmp_path / "mars_facts.txt").write_text("Mars has two moons, Phobos and Deimos.")
    tool = make_tool("search", backend=str(tmp_path), k=3)
    out = asyncio.run(invoke(tool, {"query": "Phobos"}))
    assert out.content == "[1] mars facts\nMars has two moons, Phobos and Deimos."
    out = asyncio.run(invoke(tool, {"query": "orbits Earth"}))
    assert out.content == "[1] The Moon\nThe Moon orbits the Earth every 27 days."


def test_best_snippet_centres_on_query():
    text = "Alpha beta gamma. " * 20 + "The answer is forty two. " + "Delta epsilon. " * 20
    s = best_snippet(text, "what is the answer", 60)
    assert s.startswith("...The answer is forty two.") and len(s) <= 60


class _Handler(BaseHTTPRequestHandler):
    calls: list[str] = []
    fail_first = 0

    def do_GET(self):
        type(self).calls.append(self.path)
        q = parse_qs(urlparse(self.path).query)
        if len(type(self).calls) <= type(self).fail_first:
            self.send_response(503)
            self.end_headers()
            return
        if q["q"][0] == "forbidden":
            self.send_response(403)
            self.end_headers()
            return
        if q["q"][0] == "slow":
            time.sleep(1.0)
        k = int(q["k"][0])
        body = {
            "results": [
                {"title": f"Result {i}", "snippet": f"About {q['q'][0]} number {i}.", "url": f"http://x/{i}"}
                for i in range(k)
            ]
        }
        data = json.dumps(body).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.calls = []
    _Handler.fail_first = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/search"
    srv.shutdown()
    srv.server_close()


def test_http_backend(server):
    tool = SearchTool(HTTPSearchBackend(server, retries=2, backoff_s=0.05), k=2)
    out = asyncio.run(invoke(tool, {"query": "rust"}))
    assert out.content == "[1] Result 0\nAbout rust number 0.\n\n[2] Result 1\nAbout rust number 1."
    assert out.artifact[1]["url"] == "http://x/1"
    assert _Handler.calls == ["/search?q=rust&k=2"]


def test_http_retries_with_backoff_then_succeeds(server):
    _Handler.fail_first = 2
    backend = HTTPSearchBackend(server, retries=2, backoff_s=0.1)
    t0 = time.perf_counter()
    hits = asyncio.run(backend.search("x", 1))
    assert len(_Handler.calls) == 3 and hits[0].title == "Result 0"
    assert time.perf_counter() - t0 >= 0.1 + 0.2  # backoff 0.1 then 0.2


def test_http_gives_up_and_errors_are_observations(server):
    _Handler.fail_first = 10
    backend = HTTPSearchBackend(server, retries=1, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"unavailable after 2 attempts \(HTTP 503\)"):
        asyncio.run(backend.search("x", 1))
    _Handler.fail_first = 0
    with pytest.raises(ToolError, match="HTTP 403"):
        asyncio.run(HTTPSearchBackend(server, retries=3).search("forbidden", 1))
    slow = HTTPSearchBackend(server, timeout_s=0.2, retries=1, backoff_s=0.01)
    with pytest.raises(ToolError, match="unavailable after 2 attempts \\(ReadTimeout"):
        asyncio.run(slow.search("slow", 1))
    dead = HTTPSearchBackend("http://127.0.0.1:9/none", retries=0)
    with pytest.raises(ToolError, match="unavailable after 1 attempts \\(ConnectError"):
        asyncio.run(dead.search("x", 1))
