"""``multihop``: 1- to 3-hop questions over a generated fictional knowledge base, answered by search.

The knowledge base (seeded) holds people, organisations, cities and countries with invented names
("Velmora Quist works for Drennic Foundry"), so no model can know an answer from pre-training: it
has to search. Each entity is one short document indexed by the search tool (BM25). Questions
chain relations: 1 hop ("In which city was X born?"), 2 hops ("In which country was X born?": city,
then country), 3 hops ("In which country is the organisation that X works for headquartered?").

Each task's metadata names its relation ``chain``, its ``subject``, its ``hops`` and its
``first_hop`` (subject and first relation): questions with the same ``first_hop`` start with the
same search, and ``curriculum.pair_by: first_hop`` puts them in the same training step.

Answers are checked by normalised exact match (``info["correct"]``) and token F1 (``info["f1"]``);
the training reward is ``accuracy`` with ``answer_type="text"`` (EM, or ``text_metric="f1"``).
Train and test questions are disjoint (a question's split is a hash of its text); both splits share
the one knowledge base, as an open-book QA benchmark does.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from flowgrpo.env import Split, Task, TaskOracle, ToolEnv, render_tool_call, tool_results
from flowgrpo.types import Message

SYSTEM_PROMPT = (
    "Answer the question about a fictional world. Use the search tool to look facts up; "
    "questions may need several searches. Give the final answer as <answer>...</answer>."
)

_ONSETS = ["b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "t", "th", "v", "z", "sh", "tr", "h"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "y"]
_CODAS = ["", "n", "r", "l", "s", "th", "m", "x", "nd", "rk", "st"]
_ORG_KINDS = [
    "Foundry",
    "Institute",
    "Dynamics",
    "Collective",
    "Works",
    "Labs",
    "Guild",
    "Bank",
    "Press",
    "Mills",
]
_CITY_SUFFIXES = ["mouth", "vale", "ford", "holm", "grad", "port", "wick", "burg", "moor", "haven"]
_COUNTRY_SUFFIXES = ["ia", "land", "stan", "ovia", "mark", "ora"]
_PROFESSIONS = ["engineer", "painter", "chemist", "teacher", "pilot", "architect", "historian", "baker", "botanist", "judge"]  # fmt: skip

# relation -> (sentence template of the fact, search hint the oracle appends to the subject)
RELATIONS: dict[str, tuple[str, str]] = {
    "born_city": ("{s} was born in the city of {o}.", "born city"),
    "birth_year": ("{s} was born in the year {o}.", "born year"),
    "employer": ("{s} works for {o}.", "works for"),
    "hq": ("{s} is headquartered in the city of {o}.", "headquartered city"),
    "founded_year": ("{s} was founded in the year {o}.", "founded year"),
    "founder": ("{s} was founded by {o}.", "founded by"),
    "country": ("{s} is a city in the country of {o}.", "city country"),
}

# question templates: (relation chain, subject kind, question text)
QUESTIONS: list[tuple[tuple[str, ...], str, str]] = [
    (("born_city",), "person", "In which city was {s} born?"),
    (("birth_year",), "person", "In which year was {s} born?"),
    (("employer",), "person", "Which organisation does {s} work for?"),
    (("hq",), "org", "In which city is {s} headquartered?"),
    (("founded_year",), "org", "In which year was {s} founded?"),
    (("founder",), "org", "Who founded {s}?"),
    (("country",), "city", "In which country is the city of {s}?"),
    (("born_city", "country"), "person", "In which country was {s} born?"),
    (("employer", "hq"), "person", "In which city is the organisation that {s} works for headquartered?"),
    (
        ("employer", "founded_year"),
        "person",
        "In which year was the organisation that {s} works for founded?",
    ),
    (("founder", "born_city"), "org", "In which city was the founder of {s} born?"),
    (("founder", "birth_year"), "org", "In which year was the founder of {s} born?"),
    (("hq", "country"), "org", "In which country is {s} headquartered?"),
    (
        ("employer", "hq", "country"),
        "person",
        "In which country is the organisation that {s} works for headquartered?",
    ),
    (("founder", "born_city", "country"), "org", "In which country was the founder of {s} born?"),
    (
        ("founder", "employer", "hq"),
        "org",
        "In which city is the employer of the founder of {s} headquartered?",
    ),
]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


class KnowledgeBase:
    """A seeded fictional world: ``facts[(subject, relation)] = object`` and one document per entity."""

    def __init__(
        self,
        seed: int = 0,
        *,
        num_people: int = 120,
        num_orgs: int = 40,
        num_cities: int = 30,
        num_countries: int = 8,
    ) -> None:
        rng = random.Random(f"multihop-kb:{seed}")
        used: set[str] = set()

        def fresh(make: Any) -> str:
            for _ in range(10_000):
                name = make()
                tokens = name.lower().split()
                if name not in used and not any(t in used for t in tokens if t not in _LOWER_KINDS):
                    used.add(name)
                    used.update(t for t in tokens if t not in _LOWER_KINDS)
                    return name
            raise RuntimeError("name space exhausted: lower the number of entities")

        self.countries = [
            fresh(lambda: _word(rng, 2) + rng.choice(_COUNTRY_SUFFIXES)) for _ in range(num_countries)
        ]
        self.cities = [fresh(lambda: _word(rng, 1) + rng.choice(_CITY_SUFFIXES)) for _ in range(num_cities)]
        self.people = [
            fresh(lambda: f"{_word(rng, 2)} {_word(rng, rng.choice([1, 2]))}") for _ in range(num_people)
        ]
        self.orgs = [fresh(lambda: f"{_word(rng, 2)} {rng.choice(_ORG_KINDS)}") for _ in range(num_orgs)]
        self.kind = {**dict.fromkeys(self.people, "person"), **dict.fromkeys(self.orgs, "org")}
        self.kind.update({**dict.fromkeys(self.cities, "city"), **dict.fromkeys(self.countries, "country")})
        f: dict[tuple[str, str], str] = {}
        for c in self.cities:
            f[(c, "country")] = rng.choice(self.countries)
        for p in self.people:
            f[(p, "born_city")] = rng.choice(self.cities)
            f[(p, "birth_year")] = str(rng.randint(1900, 1999))
            f[(p, "employer")] = rng.choice(self.orgs)
        for o in self.orgs:
            f[(o, "hq")] = rng.choice(self.cities)
            f[(o, "founded_year")] = str(rng.randint(1700, 1990))
            f[(o, "founder")] = rng.choice(self.people)
        self.facts = f
        self.profession = {p: rng.choice(_PROFESSIONS) for p in self.people}
        self.population = {c: rng.randint(5, 900) * 1000 for c in self.cities}

    def follow(self, subject: str, chain: tuple[str, ...]) -> str:
        x = subject
        for rel in chain:
            x = self.facts[(x, rel)]
        return x

    def documents(self) -> list[dict[str, str]]:
        """One document per entity: ``{"id", "title", "text"}``."""
        by_subject: dict[str, list[str]] = {}
        for (s, rel), o in self.facts.items():
            by_subject.setdefault(s, []).append(RELATIONS[rel][0].format(s=s, o=o))
        docs = []
        for p in self.people:
            lines = [f"{p} is a {self.profession[p]}.", *by_subject[p]]
            docs.append({"id": _slug(p), "title": p, "text": " ".join(lines)})
        for o in self.orgs:
            docs.append({"id": _slug(o), "title": o, "text": " ".join(by_subject[o])})
        for c in self.cities:
            lines = [*by_subject[c], f"{c} has a population of {self.population[c]:,}."]
            docs.append({"id": _slug(c), "title": c, "text": " ".join(lines)})
        for k in self.countries:
            n = sum(1 for c in self.cities if self.facts[(c, "country")] == k)
            docs.append({"id": _slug(k), "title": k, "text": f"{k} is a country with {n} major cities."})
        return docs


_LOWER_KINDS = {k.lower() for k in _ORG_KINDS}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def extract_fact(text: str, subject: str, relation: str) -> str | None:
    """The object of ``relation`` for ``subject`` in retrieved text, by the KB's sentence template."""
    template = RELATIONS[relation][0]
    pattern = (
        re.escape(template).replace(re.escape("{s}"), re.escape(subject)).replace(re.escape("{o}"), r"(.+?)")
    )
    m = re.search(pattern.removesuffix(r"\.") + r"\.(?:\s|$)", text)
    return m.group(1).strip() if m else None


class MultihopOracle(TaskOracle):
    """Follows the question's relation chain with one search per hop, reading each hop's answer
    from the search results it sees (never from the knowledge base), then answers."""

    async def act(self, messages: list[Message]) -> str:
        task = self.task_for(messages)
        chain: list[str] = task.metadata["chain"]
        entity: str = task.metadata["subject"]
        hop = 0
        results = [m for m in tool_results(messages) if m.name == "search"]
        # replay the hops: each search result should resolve the current hop
        pending_retry = False
        for res in results:
            value = extract_fact(res.content, entity, chain[hop])
            if value is None:
                pending_retry = True
                continue
            pending_retry = False
            entity, hop = value, hop + 1
            if hop == len(chain):
                return f"<answer>{entity}</answer>"
        query = entity if pending_retry else f"{entity} {RELATIONS[chain[hop]][1]}"
        return render_tool_call("search", {"query": query})


class MultihopEnv(ToolEnv):
    """Multi-hop QA over a fictional knowledge base with a BM25 search tool.

    Args:
        seed: seeds the knowledge base and the question sample.
        hops: which hop counts to ask (subset of {1, 2, 3}).
        chains: only these relation chains, written as ``by_task --key chain`` prints them
            (``["born_city", "born_city > country"]``); ``None`` asks every chain of ``hops``. A
            kept question has the split and the id it has without ``chains`` (same ``hops``), so RL
            on some chains is scored, and its batches read, against the full environment's tasks.
        num_people / num_orgs / num_cities / num_countries: size of the world.
        num_train / num_test: questions per split (capped by what the world offers).
        test_fraction: share of questions hashed into the test split.
        k: documents returned per search.
        tools: override the tool list (default: SearchTool over the KB documents).
    """

    name = "multihop"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        *,
        seed: int = 0,
        hops: tuple[int, ...] | list[int] = (1, 2, 3),
        chains: list[str] | None = None,
        num_people: int = 120,
        num_orgs: int = 40,
        num_cities: int = 30,
        num_countries: int = 8,
        num_train: int = 1000,
        num_test: int = 200,
        test_fraction: float = 0.2,
        k: int = 3,
        tools: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not set(hops) <= {1, 2, 3} or not hops:
            raise ValueError(f"hops must be a non-empty subset of (1, 2, 3), got {hops}")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.chains = None if chains is None else {parse_chain(c) for c in chains}
        if self.chains is not None:
            known = {c for c, _, _ in QUESTIONS if len(c) in hops}
            if not self.chains or not self.chains <= known:
                names = ", ".join(sorted(" > ".join(c) for c in known))
                raise ValueError(
                    f"chains must be a non-empty list of the chains of hops {list(hops)}: {names}; got {chains}"
                )
        self.kb = KnowledgeBase(
            seed, num_people=num_people, num_orgs=num_orgs, num_cities=num_cities, num_countries=num_countries
        )
        if tools is None:
            tools = [make_search_tool(self.kb.documents(), k=k)]
        super().__init__(tools, **kwargs)
        self.seed, self.hops = seed, tuple(sorted(set(hops)))
        self.num_train, self.num_test, self.test_fraction = num_train, num_test, test_fraction
        self._cache: dict[str, list[Task]] | None = None

    def documents(self) -> list[dict[str, str]]:
        return self.kb.documents()

    def _generate(self) -> dict[str, list[Task]]:
        subjects = {"person": self.kb.people, "org": self.kb.orgs, "city": self.kb.cities}
        questions = []
        for chain, kind, template in QUESTIONS:
            if len(chain) not in self.hops:
                continue
            for s in subjects[kind]:
                questions.append((template.format(s=s), chain, s))
        random.Random(f"multihop-q:{self.seed}").shuffle(questions)
        out: dict[str, list[Task]] = {"train": [], "test": []}
        want = {"train": self.num_train, "test": self.num_test}
        count = {"train": 0, "test": 0}  # over every chain of `hops`: ids do not depend on `chains`
        for prompt, chain, s in questions:
            h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") / 2**64
            split = "test" if h < self.test_fraction else "train"
            if count[split] >= want[split]:
                continue
            index = count[split]
            count[split] += 1
            if self.chains is not None and chain not in self.chains:
                continue
            answer = self.kb.follow(s, chain)
            out[split].append(
                Task(
                    id=f"multihop-{self.seed}-{split}-{index:05d}",
                    prompt=prompt,
                    answer=answer,
                    metadata={
                        "answer_type": "text",
                        "chain": list(chain),
                        "subject": s,
                        "hops": len(chain),
                        "first_hop": [s, chain[0]],
                    },
                )
            )
        return out

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if self._cache is None:
            self._cache = self._generate()
        return list(self._cache[split])

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        from flowgrpo.rewards import exact_match

        return None if task.answer is None else bool(exact_match(answer, task.answer))

    async def step(self, action: Any) -> Any:
        result = await super().step(action)
        if result.terminated and self.task is not None and self.task.answer is not None:
            from flowgrpo.rewards import f1_score

            result.info["f1"] = f1_score(result.info.get("answer"), self.task.answer)
        return result

    def oracle(self) -> MultihopOracle:
        return MultihopOracle(self.tasks("train") + self.tasks("test"))


def parse_chain(text: str) -> tuple[str, ...]:
    """``"born_city > country"`` -> ``("born_city", "country")``."""
    return tuple(part.strip() for part in str(text).split(">"))


def make_search_tool(docs: list[dict[str, str]], *, k: int = 3) -> Any:
    """The built-in SearchTool over ``docs`` with a BM25 backend."""
    from flowgrpo.tools.search import BM25Backend, SearchTool

    return SearchTool(BM25Backend(docs), k=k, max_chars=400 * k)
