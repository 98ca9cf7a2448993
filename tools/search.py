"""A search tool over pluggable backends: a local BM25 index (``bm25s``) or an HTTP search API.

``SearchTool`` formats the top-k hits as short titled snippets under a character budget, because
the reader is a small model with a 2k-token context: ``[1] Title\\nsnippet...``.

Backends implement ``async search(query, k) -> list[SearchHit]``:
- :class:`BM25Backend`: Okapi BM25 (Robertson & Zaragoza, 2009) via the maintained ``bm25s``
  library (sparse precomputed scores), over a list of documents, a JSONL corpus or a folder.
- :class:`HTTPSearchBackend`: a JSON search API over ``httpx`` with a timeout and retries with
  exponential backoff on connection errors, timeouts, 429 and 5xx.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.tool import ToolError, ToolOutput
from flowgrpo.utils.http import RetriesExhausted, request_with_retries

log = logging.getLogger(__name__)


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    title: str = ""
    text: str


class SearchHit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    snippet: str
    score: float = 0.0
    id: str | None = None
    url: str | None = None


@runtime_checkable
class SearchBackend(Protocol):
    async def search(self, query: str, k: int) -> list[SearchHit]: ...


_WORD = re.compile(r"\w\w+", re.UNICODE)
_SENT = re.compile(r"(?<=[.!?])\s+")


def best_snippet(text: str, query: str, max_chars: int) -> str:
    """The part of ``text`` (at most ``max_chars``) that starts at the sentence sharing the most
    words with ``query``; ``...`` marks a cut."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    q = {w.lower() for w in _WORD.findall(query)}
    sentences = _SENT.split(text)
    best_score, offset, start = -1, 0, 0
    for s in sentences:
        idx = text.find(s, offset)
        score = len(q & {w.lower() for w in _WORD.findall(s)})
        if score > best_score:
            best_score, start = score, idx
        offset = idx + len(s)
    piece = text[start:]
    prefix = "..." if start > 0 else ""
    budget = max(max_chars - len(prefix) - 3, 1)
    if len(piece) > budget:
        cut = piece[:budget].rsplit(" ", 1)[0] or piece[:budget]
        piece = cut + "..."
    return prefix + piece


class BM25Backend:
    """BM25 over in-memory documents (``bm25s``, English stopwords, lowercase, no stemming)."""

    def __init__(self, docs: Iterable[Document | Mapping[str, Any]], *, snippet_chars: int = 300) -> None:
        # bm25s takes JAX for its top-k wherever JAX is installed, and JAX's first use holds 75% of a
        # GPU's memory: six training runs sharing an H200 went out of memory. One query's top-k needs
        # no GPU, so JAX stays on the CPU unless the user chose a platform.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.docs: list[Document] = []
        for i, d in enumerate(docs):
            if isinstance(d, Document):
                self.docs.append(d)
            else:
                self.docs.append(
                    Document(id=str(d.get("id", i)), title=str(d.get("title", "")), text=str(d["text"]))
                )
        if not self.docs:
            raise ValueError("BM25Backend needs at least one document")
        self.snippet_chars = snippet_chars
        self._tokenizer = Tokenizer(stopwords="en")
        ids = self._tokenizer.tokenize(
            [f"{d.title}\n{d.text}" for d in self.docs], show_progress=False, return_as="ids"
        )
        self._index = bm25s.BM25()
        self._index.index(ids, show_progress=False)

    @classmethod
    def from_jsonl(
        cls,
        path: str | Path,
        *,
        text_field: str = "text",
        title_field: str = "title",
        id_field: str = "id",
        **kw: Any,
    ) -> BM25Backend:
        """One JSON object per line with at least ``text_field``."""
        docs = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                if text_field not in obj:
                    raise ValueError(f"{path}:{n}: missing field {text_field!r} (set text_field=...)")
                docs.append(
                    Document(
                        id=str(obj.get(id_field, n)),
                        title=str(obj.get(title_field, "")),
                        text=str(obj[text_field]),
                    )
                )
        return cls(docs, **kw)

    @classmethod
    def from_folder(
        cls, folder: str | Path, *, patterns: Sequence[str] = ("*.txt", "*.md"), **kw: Any
    ) -> BM25Backend:
        """Every matching file under ``folder`` is a document; the title is a leading markdown
        heading if any, else the file name."""
        root = Path(folder)
        docs = []
        for pattern in patterns:
            for p in sorted(root.rglob(pattern)):
                text = p.read_text(encoding="utf-8", errors="replace")
                lines = text.lstrip().splitlines()
                title = p.stem.replace("_", " ")
                if lines and lines[0].startswith("#"):
                    title, text = lines[0].lstrip("#").strip(), "\n".join(lines[1:])
                docs.append(Document(id=str(p.relative_to(root)), title=title, text=text))
        if not docs:
            raise ValueError(f"no documents matching {list(patterns)} under {root}")
        return cls(docs, **kw)

    def search_sync(self, query: str, k: int) -> list[SearchHit]:
        q = self._tokenizer.tokenize([query], update_vocab=False, show_progress=False, return_as="ids")
        k = min(k, len(self.docs))
        # numpy's top-k, with or without JAX installed: the same hits on every machine
        idx, scores = self._index.retrieve(q, k=k, show_progress=False, backend_selection="numpy")
        hits = []
        for i, s in zip(idx[0].tolist(), scores[0].tolist(), strict=True):
            if s <= 0:
                continue
            d = self.docs[i]
            hits.append(
                SearchHit(
                    title=d.title, snippet=best_snippet(d.text, query, self.snippet_chars), score=s, id=d.id
                )
            )
        return hits

    async def search(self, query: str, k: int) -> list[SearchHit]:
        if len(self.docs) > 20_000:  # big corpora: keep the event loop free
            return await asyncio.to_thread(self.search_sync, query, k)
        return self.search_sync(query, k)


class HTTPSearchBackend:
    """A JSON search API: ``GET url?{query_param}=...&{k_param}=k`` (or POST a JSON body).

    The response is a list of hits or an object whose ``results_key`` holds one; each hit has a
    title (``title_key``) and a text (``text_key``, falling back to "snippet"/"text"/"content").
    Connection errors, timeouts, HTTP 429 and 5xx are retried ``retries`` times with exponential
    backoff (``backoff_s * 2**attempt``); other HTTP errors fail at once.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.25,
        method: str = "GET",
        query_param: str = "q",
        k_param: str | None = "k",
        results_key: str = "results",
        title_key: str = "title",
        text_key: str = "snippet",
        headers: Mapping[str, str] | None = None,
        snippet_chars: int = 300,
    ) -> None:
        if method not in ("GET", "POST"):
            raise ValueError("method must be GET or POST")
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.method, self.query_param, self.k_param = method, query_param, k_param
        self.results_key, self.title_key, self.text_key = results_key, title_key, text_key
        self.headers = dict(headers or {})
        self.snippet_chars = snippet_chars

    def _hits(self, data: Any, query: str, k: int) -> list[SearchHit]:
        items = data.get(self.results_key, []) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ToolError(f"search service returned an unexpected response (no {self.results_key!r} list)")
        hits = []
        for it in items[:k]:
            if not isinstance(it, dict):
                continue
            text = next(
                (str(it[key]) for key in (self.text_key, "snippet", "text", "content") if key in it), ""
            )
            hits.append(
                SearchHit(
                    title=str(it.get(self.title_key, "")),
                    snippet=best_snippet(text, query, self.snippet_chars),
                    score=float(it.get("score", 0.0) or 0.0),
                    url=it.get("url"),
                )
            )
        return hits

    async def search(self, query: str, k: int) -> list[SearchHit]:
        import httpx

        params: dict[str, Any] = {self.query_param: query}
        if self.k_param:
            params[self.k_param] = k
        where = {"params": params} if self.method == "GET" else {"json": params}
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
            try:
                r = await request_with_retries(
                    client,
                    self.method,
                    self.url,
                    retries=self.retries,
                    backoff_s=self.backoff_s,
                    timeout_s=self.timeout_s,
                    **where,
                )
            except RetriesExhausted as e:
                raise ToolError(
                    f"search service unavailable after {e.attempts} attempts ({e.last}); try again later"
                ) from e
        if r.status_code >= 400:
            raise ToolError(f"search service refused the query: HTTP {r.status_code}")
        try:
            data = r.json()
        except ValueError as e:
            raise ToolError("search service returned invalid JSON") from e
        return self._hits(data, query, k)


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(description="What to look for, in a few words", examples=["capital of France"])


class SearchTool:
    """The ``search`` tool: top-``k`` titled snippets, ``max_chars`` in all.

    ``backend`` is a :class:`SearchBackend`, or a path: a ``.jsonl`` file or a folder of documents
    (indexed with BM25), so ``make_tool("search", backend="corpus.jsonl")`` works from a config.
    """

    name = "search"
    description = "Search the documents and return the most relevant passages."
    args_schema = SearchArgs

    def __init__(
        self,
        backend: SearchBackend | str | Path,
        *,
        k: int = 3,
        max_chars: int = 800,
        timeout_s: float | None = 10.0,
    ) -> None:
        if isinstance(backend, (str, Path)):
            p = Path(backend)
            backend = BM25Backend.from_folder(p) if p.is_dir() else BM25Backend.from_jsonl(p)
        if not isinstance(backend, SearchBackend):
            raise TypeError(
                f"backend must have an async search(query, k) method, got {type(backend).__name__}"
            )
        if k < 1 or max_chars < 50:
            raise ValueError("k must be >= 1 and max_chars >= 50")
        self.backend, self.k, self.max_chars, self.timeout_s = backend, k, max_chars, timeout_s

    def format(self, query: str, hits: Sequence[SearchHit]) -> str:
        if not hits:
            return f"No results for {query!r}. Try other words."
        budget = self.max_chars // len(hits)
        parts = []
        for i, h in enumerate(hits, 1):
            head = f"[{i}] {h.title}".strip() if h.title else f"[{i}]"
            room = max(budget - len(head) - 2, 20)
            snippet = h.snippet if len(h.snippet) <= room else h.snippet[: room - 3].rsplit(" ", 1)[0] + "..."
            parts.append(f"{head}\n{snippet}")
        return "\n\n".join(parts)[: self.max_chars]

    async def run(self, args: BaseModel) -> ToolOutput:
        """Content: the formatted hits; artifact: the hits (ids, scores, urls) for rewards/replay."""
        query = args.query.strip()  # type: ignore[attr-defined]
        if not query:
            raise ToolError("empty query: write a few words to search for")
        hits = (await self.backend.search(query, self.k))[: self.k]
        return ToolOutput(content=self.format(query, hits), artifact=[h.model_dump() for h in hits])


__all__ = [
    "BM25Backend",
    "Document",
    "HTTPSearchBackend",
    "SearchArgs",
    "SearchBackend",
    "SearchHit",
    "SearchTool",
    "best_snippet",
]
