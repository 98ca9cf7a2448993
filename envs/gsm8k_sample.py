"""The GSM8K-format sample shipped in ``envs/data/gsm8k_sample_{train,test}.jsonl``.

It is **not GSM8K**: every problem is written by this module from one of the templates below
(shopping with change, wages, distance, recipes, savings goals, discounts, reading plans, sharing,
legs on a farm, tickets, weekly training, fractions of a class, ages, gardens), with numbers drawn
by a seeded generator (``random.Random("gsm8k-sample:<seed>")``). It has GSM8K's format, so the
same loader reads both: one ``{"question": ..., "answer": "<reasoning> #### N"}`` object a line,
where the reasoning is short sentences with GSM8K's calculator annotations
(``3 * 4 = <<3*4=12>>12``) and N is the integer answer. Every intermediate value is a non-negative
integer and every annotation is checked when the problem is made (``tests/test_gsm8k.py`` checks the
shipped files again and that regenerating them gives the same bytes).

Split: a problem is in the test split iff a hash of its question falls in the lowest
``test_fraction`` (so it does not depend on how many problems were generated or in which order).

Regenerate with ``python -m flowgrpo.envs.gsm8k_sample`` (writes the two files next to the others).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections.abc import Callable
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLE_FILES = {split: DATA_DIR / f"gsm8k_sample_{split}.jsonl" for split in ("train", "test")}
NUM_PROBLEMS = 400
TEST_FRACTION = 0.2

_PEOPLE = [
    ("Ana", "she", "her"), ("Ben", "he", "his"), ("Cara", "she", "her"), ("Dev", "he", "his"),
    ("Elif", "she", "her"), ("Femi", "he", "his"), ("Grace", "she", "her"), ("Hugo", "he", "his"),
    ("Ines", "she", "her"), ("Jamal", "he", "his"), ("Keiko", "she", "her"), ("Liam", "he", "his"),
    ("Maya", "she", "her"), ("Noah", "he", "his"), ("Olga", "she", "her"), ("Pedro", "he", "his"),
    ("Quinn", "she", "her"), ("Rami", "he", "his"), ("Sofia", "she", "her"), ("Tariq", "he", "his"),
]  # fmt: skip


class _Steps:
    """Reasoning sentences with checked GSM8K calculator annotations."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def calc(self, expr: str, value: int, sentence: str) -> int:
        """``sentence`` with ``{calc}`` replaced by ``expr = <<expr=value>>value``."""
        if evaluate(expr) != value or value < 0:
            raise ValueError(f"a template made a wrong step: {expr} = {value}")
        compact = expr.replace(" ", "")
        self.lines.append(sentence.format(calc=f"{expr} = <<{compact}={value}>>{value}"))
        return value

    def answer(self, value: int) -> str:
        return "\n".join(self.lines) + f"\n#### {value}"


_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(expr: str) -> int | float:
    """The value of a +, -, *, / expression over integers (no names, no calls: a parser, not eval)."""

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            out = _OPS[type(node.op)](ev(node.left), ev(node.right))
            return int(out) if isinstance(out, float) and out.is_integer() else out
        raise ValueError(f"not plain arithmetic: {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


# -- templates: rng -> (question, answer) ---------------------------------------------------------


def _shopping(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    a, p = rng.randint(2, 6), rng.randint(2, 9)
    b, q = rng.randint(2, 5), rng.randint(3, 12)
    item1, item2 = rng.sample(["notebooks", "pens", "apples", "muffins", "candles", "socks"], 2)
    bill = min(x for x in (20, 50, 100, 200) if x > a * p + b * q)
    s = _Steps()
    x = s.calc(f"{a} * {p}", a * p, f"The {item1} cost {{calc}} dollars.")
    y = s.calc(f"{b} * {q}", b * q, f"The {item2} cost {{calc}} dollars.")
    t = s.calc(f"{x} + {y}", x + y, "Altogether that is {calc} dollars.")
    c = s.calc(f"{bill} - {t}", bill - t, "The change is {calc} dollars.")
    return (
        f"{name} buys {a} {item1} for ${p} each and {b} {item2} for ${q} each. "
        f"{pron.capitalize()} pays with a ${bill} bill. How much change does {pron} get, in dollars?",
        s.answer(c),
    )


def _wages(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    h, r, d = rng.randint(3, 9), rng.randint(8, 25), rng.randint(3, 6)
    job = rng.choice(["at a bakery", "at the library", "as a tutor", "at a bike shop", "in a cafe"])
    s = _Steps()
    per_day = s.calc(f"{h} * {r}", h * r, f"{name} earns {{calc}} dollars a day.")
    total = s.calc(f"{per_day} * {d}", per_day * d, f"In {d} days {pron} earns {{calc}} dollars.")
    return (
        f"{name} works {job} for {h} hours a day and is paid ${r} an hour. "
        f"How many dollars does {pron} earn in {d} days?",
        s.answer(total),
    )


def _distance(rng: random.Random) -> tuple[str, str]:
    name, _, _ = rng.choice(_PEOPLE)
    s1, h1 = rng.choice([40, 45, 50, 55, 60, 65]), rng.randint(2, 5)
    s2, h2 = rng.choice([20, 25, 30, 35]), rng.randint(1, 3)
    s = _Steps()
    d1 = s.calc(f"{s1} * {h1}", s1 * h1, "On the highway: {calc} miles.")
    d2 = s.calc(f"{s2} * {h2}", s2 * h2, "In town: {calc} miles.")
    total = s.calc(f"{d1} + {d2}", d1 + d2, "In total: {calc} miles.")
    return (
        f"{name} drives at {s1} miles per hour for {h1} hours on the highway, then at {s2} miles per "
        f"hour for {h2} hours in town. How many miles does {name} drive in total?",
        s.answer(total),
    )


def _recipe(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    per_batch, cups, k = rng.choice([12, 16, 20, 24]), rng.randint(2, 4), rng.randint(2, 6)
    food = rng.choice(["cookies", "muffins", "pancakes", "rolls"])
    want = per_batch * k
    s = _Steps()
    batches = s.calc(f"{want} / {per_batch}", k, f"{name} needs {{calc}} batches.")
    flour = s.calc(f"{batches} * {cups}", batches * cups, "That takes {calc} cups of flour.")
    return (
        f"One batch of {food} uses {cups} cups of flour and makes {per_batch} {food}. "
        f"{name} wants to make {want} {food}. How many cups of flour does {pron} need?",
        s.answer(flour),
    )


def _savings(rng: random.Random) -> tuple[str, str]:
    name, pron, poss = rng.choice(_PEOPLE)
    per_week, weeks, have = rng.choice([5, 6, 8, 10, 12, 15]), rng.randint(3, 12), rng.randint(10, 60)
    price = have + per_week * weeks
    thing = rng.choice(["a bike", "a guitar", "a tablet", "a telescope", "a skateboard"])
    s = _Steps()
    need = s.calc(f"{price} - {have}", price - have, f"{name} still needs {{calc}} dollars.")
    w = s.calc(f"{need} / {per_week}", weeks, "Saving every week, that takes {calc} weeks.")
    return (
        f"{name} wants {thing} that costs ${price}. {pron.capitalize()} has ${have} in {poss} piggy bank "
        f"and saves ${per_week} every week. How many weeks until {pron} can buy it?",
        s.answer(w),
    )


def _discount(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    pct = rng.choice([10, 20, 25, 50])
    price = rng.choice([20, 40, 60, 80, 100, 120])
    n = rng.randint(2, 5)
    item = rng.choice(["jackets", "board games", "lamps", "backpacks", "plants"])
    off = price * pct // 100
    s = _Steps()
    o = s.calc(f"{price} * {pct} / 100", off, "The discount is {calc} dollars per item.")
    each = s.calc(f"{price} - {o}", price - o, "Each item costs {calc} dollars on sale.")
    total = s.calc(f"{each} * {n}", each * n, f"{name} pays {{calc}} dollars.")
    return (
        f"{item.capitalize()} cost ${price} each, and the store takes {pct}% off. "
        f"{name} buys {n} {item}. How many dollars does {pron} pay?",
        s.answer(total),
    )


def _reading(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    a = rng.randint(10, 40)
    pages = rng.randint(3 * a + 10, 3 * a + 150)
    s = _Steps()
    b = s.calc(f"{a} * 2", a * 2, f"On Sunday {pron} reads {{calc}} pages.")
    done = s.calc(f"{a} + {b}", a + b, "Over the weekend that is {calc} pages.")
    left = s.calc(f"{pages} - {done}", pages - done, "Pages left: {calc}.")
    return (
        f"{name}'s book has {pages} pages. {pron.capitalize()} reads {a} pages on Saturday and twice as "
        f"many on Sunday. How many pages are left to read?",
        s.answer(left),
    )


def _sharing(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    k = rng.choice([2, 3, 4, 5])
    total = k * rng.randint(6, 20)
    item = rng.choice(["stickers", "marbles", "grapes", "cards", "candies"])
    s = _Steps()
    given = s.calc(f"{total} / {k}", total // k, f"{name} gives away {{calc}} {item}.")
    kept = s.calc(f"{total} - {given}", total - given, f"{pron.capitalize()} keeps {{calc}}.")
    e = rng.randint(1, kept - 1)
    left = s.calc(f"{kept} - {e}", kept - e, "After the next day {calc} are left.")
    frac = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}[k]
    verb = "eats" if item in ("grapes", "candies") else "loses"
    return (
        f"{name} has {total} {item}. {pron.capitalize()} gives {frac} of them to a friend, and the next "
        f"day {pron} {verb} {e} of the rest. How many {item} does {name} have left?",
        s.answer(left),
    )


def _legs(rng: random.Random) -> tuple[str, str]:
    name, _, _ = rng.choice(_PEOPLE)
    c, w = rng.randint(3, 30), rng.randint(2, 15)
    two, four = rng.choice(["chickens", "ducks", "geese"]), rng.choice(["cows", "goats", "sheep", "pigs"])
    s = _Steps()
    a = s.calc(f"{c} * 2", c * 2, f"The {two} have {{calc}} legs.")
    b = s.calc(f"{w} * 4", w * 4, f"The {four} have {{calc}} legs.")
    t = s.calc(f"{a} + {b}", a + b, "Together: {calc} legs.")
    return (
        f"{name}'s farm has {c} {two} and {w} {four}. How many legs do the animals have altogether?",
        s.answer(t),
    )


def _tickets(rng: random.Random) -> tuple[str, str]:
    name, _, poss = rng.choice(_PEOPLE)
    adult, child = rng.randint(8, 20), rng.randint(3, 9)
    x, y, park = rng.randint(1, 4), rng.randint(1, 5), rng.choice([5, 8, 10, 12])
    place = rng.choice(["the zoo", "a museum", "the aquarium", "a theme park"])
    s = _Steps()
    a = s.calc(f"{x} * {adult}", x * adult, "Adult tickets: {calc} dollars.")
    b = s.calc(f"{y} * {child}", y * child, "Child tickets: {calc} dollars.")
    t = s.calc(f"{a} + {b} + {park}", a + b + park, "With parking: {calc} dollars.")
    return (
        f"{name} takes {poss} family to {place}: {x} adults and {y} children. Adult tickets cost ${adult}, "
        f"child tickets ${child}, and parking is ${park}. How many dollars does the trip cost?",
        s.answer(t),
    )


def _training(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    wd, we, n = rng.randint(2, 6), rng.randint(5, 12), rng.randint(2, 4)
    sport = rng.choice(["runs", "cycles", "swims"])
    unit = "kilometers" if sport != "swims" else "laps"
    s = _Steps()
    a = s.calc(f"{wd} * 5", wd * 5, f"On weekdays {pron} {sport} {{calc}} {unit}.")
    b = s.calc(f"{we} * 2", we * 2, f"On the weekend {pron} {sport} {{calc}} {unit}.")
    week = s.calc(f"{a} + {b}", a + b, "One week: {calc} " + unit + ".")
    total = s.calc(f"{week} * {n}", week * n, f"In {n} weeks: {{calc}} {unit}.")
    return (
        f"{name} {sport} {wd} {unit} every weekday and {we} {unit} on each day of the weekend. "
        f"How many {unit} does {pron} do in {n} weeks?",
        s.answer(total),
    )


def _class(rng: random.Random) -> tuple[str, str]:
    k = rng.choice([2, 3, 4, 5])
    m = rng.randint(2, 8) * 2
    n = k * m
    frac = {2: "Half", 3: "A third", 4: "A quarter", 5: "A fifth"}[k]
    club = rng.choice(["chess club", "choir", "soccer team", "robotics club"])
    s = _Steps()
    g = s.calc(f"{n} / {k}", m, "{calc} students are girls.")
    boys = s.calc(f"{n} - {g}", n - g, "{calc} students are boys.")
    j = s.calc(f"{boys} / 2", boys // 2, f"{{calc}} boys are in the {club}.")
    left = s.calc(f"{boys} - {j}", boys - j, "{calc} boys are not.")
    return (
        f"A class has {n} students. {frac} of them are girls, and half of the boys are in the {club}. "
        f"How many boys are not in the {club}?",
        s.answer(left),
    )


def _ages(rng: random.Random) -> tuple[str, str]:
    (n1, _, _), (n2, _, _) = rng.sample(_PEOPLE, 2)
    young, diff, later = rng.randint(5, 30), rng.randint(2, 15), rng.randint(2, 10)
    s = _Steps()
    old = s.calc(f"{young} + {diff}", young + diff, f"{n1} is {{calc}} years old.")
    a = s.calc(f"{old} + {later}", old + later, f"In {later} years {n1} will be {{calc}}.")
    b = s.calc(f"{young} + {later}", young + later, f"{n2} will be {{calc}}.")
    t = s.calc(f"{a} + {b}", a + b, "The sum will be {calc}.")
    return (
        f"{n1} is {diff} years older than {n2}, who is {young}. What will the sum of their ages be in "
        f"{later} years?",
        s.answer(t),
    )


def _garden(rng: random.Random) -> tuple[str, str]:
    name, pron, _ = rng.choice(_PEOPLE)
    rows, per = rng.randint(3, 12), rng.randint(4, 15)
    k = rng.choice([2, 3, 4, 5, 6])
    plant = rng.choice(["tomato plants", "tulips", "cabbages", "sunflowers"])
    s = _Steps()
    total = s.calc(f"{rows} * {per}", rows * per, f"{name} plants {{calc}} {plant}.")
    dead = rng.randint(1, total // 3)
    alive = s.calc(f"{total} - {dead}", total - dead, "{calc} survive.")
    alive_r = alive - alive % k
    if alive_r == 0:
        return _garden(rng)
    baskets = s.calc(f"{alive_r} / {k}", alive_r // k, "The full pots: {calc}.")
    return (
        f"{name} plants {rows} rows of {plant} with {per} in each row, and {dead} of them die. "
        f"{pron.capitalize()} puts the rest in pots of {k}. How many pots can {pron} fill completely?",
        s.answer(baskets),
    )


TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    _shopping, _wages, _distance, _recipe, _savings, _discount, _reading,
    _sharing, _legs, _tickets, _training, _class, _ages, _garden,
]  # fmt: skip


def split_of(question: str, test_fraction: float = TEST_FRACTION) -> str:
    h = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") / 2**64
    return "test" if h < test_fraction else "train"


def generate(n: int = NUM_PROBLEMS, *, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """``n`` distinct problems, split into train and test by the hash of the question."""
    rng = random.Random(f"gsm8k-sample:{seed}")
    seen: set[str] = set()
    out: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    while len(seen) < n:
        question, answer = rng.choice(TEMPLATES)(rng)
        if question in seen:
            continue
        seen.add(question)
        out[split_of(question)].append({"question": question, "answer": answer})
    return out


def write(out_dir: Path = DATA_DIR, *, n: int = NUM_PROBLEMS, seed: int = 0) -> dict[str, Path]:
    paths = {}
    for split, rows in generate(n, seed=seed).items():
        path = out_dir / f"gsm8k_sample_{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        paths[split] = path
    return paths


if __name__ == "__main__":
    for split, path in write().items():
        print(f"{split}: {path}")
