"""A fictional world generated from a seed: the default corpus and questions of the task.

Regions, cities, organisations, people and events, each with one document, linked by
functional relations (a person's birthplace, an organisation's founder, an event's host city,
...). Every relation is stated in its subject's document by one sentence that contains the
relation's find pattern (e.g. ``founded``); other documents mention the same entities, so a
search for a name returns distractors too. A question walks 2-4 relations from a named entity:
"What is the birthplace of the founder of the organiser of the Brennik Games?".

The same seed always gives the same documents and questions; held-out questions are drawn
from their own random stream first, so they do not change with the number of training
questions, and training questions never repeat a held-out question.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bidswarm.envs.research.config import WorldSize
from bidswarm.envs.research.corpus import Document, Hop, Question

ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s"]
ONSETS += ["sh", "st", "t", "th", "v", "w", "z", "c"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou", "ya", "ei"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "rn", "nd", "x", "k"]

FIELDS = ["astronomy", "law", "medicine", "shipbuilding", "poetry", "cartography", "music"]
FIELDS += ["alchemy", "trade", "architecture", "history", "botany", "weaving", "masonry"]
ORG_KINDS = [("{} Guild", "guild"), ("{} Trading Company", "trading company")]
ORG_KINDS += [("Order of {}", "religious order"), ("{} Academy", "school")]
ORG_KINDS += [
    ("{} Bank", "bank"),
    ("{} Observatory", "observatory"),
    ("{} Press", "printing house"),
]
EVENT_KINDS = [("{} Games", "sporting contest"), ("{} Accord", "treaty signing")]
EVENT_KINDS += [("Festival of {}", "festival"), ("{} Fair", "market fair")]
EVENT_KINDS += [("Siege of {}", "siege"), ("{} Congress", "congress")]
REGION_KINDS = ["{} Reach", "{} Province", "{} Marches", "{} Vale"]
RIVERS = ["grey", "swift", "green", "broad", "cold", "winding", "slow", "silver"]


@dataclass
class Entity:
    """One thing in the world; ``relations`` maps a relation name to its value's entity key."""

    key: str
    kind: str
    name: str
    doc_id: str = ""
    year: int = 0
    relations: dict[str, str] = field(default_factory=dict)
    facts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Relation:
    """A relation usable as a hop: the phrase a question uses and the pattern a find needs."""

    phrase: str
    pattern: str
    target: str  # kind of the value entity, or "year"


RELATIONS: dict[str, dict[str, Relation]] = {
    "person": {
        "birthplace": Relation("the birthplace of", "born", "city"),
        "employer": Relation("the employer of", "works for", "org"),
        "mentor": Relation("the mentor of", "trained by", "person"),
        "birth_year": Relation("the birth year of", "born", "year"),
    },
    "city": {
        "region": Relation("the region of", "region", "region"),
        "mayor": Relation("the mayor of", "mayor", "person"),
    },
    "region": {
        "capital": Relation("the capital of", "capital", "city"),
        "governor": Relation("the governor of", "governed", "person"),
    },
    "org": {
        "headquarters": Relation("the home city of", "headquartered", "city"),
        "founder": Relation("the founder of", "founded", "person"),
        "leader": Relation("the leader of", "led by", "person"),
        "founding_year": Relation("the founding year of", "founded", "year"),
    },
    "event": {
        "host": Relation("the host city of", "held in", "city"),
        "organiser": Relation("the organiser of", "organised", "org"),
        "event_year": Relation("the year of", "held in", "year"),
    },
}


PATTERN_WORDS = {
    word for kinds in RELATIONS.values() for r in kinds.values() for word in r.pattern.split()
}
"""Words of find patterns; no invented name may be one, so a find never matches a name."""


class _Names:
    """Unique invented words: each word names one entity only, so names never collide."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self) -> str:
        while True:
            syllables = self.rng.choice([2, 2, 2, 3])
            word = "".join(
                self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)
                for _ in range(syllables)
            ).capitalize()
            if word not in self.used and word.lower() not in PATTERN_WORDS and 4 <= len(word) <= 11:
                self.used.add(word)
                return word


def _build_entities(rng: random.Random, size: WorldSize) -> dict[str, Entity]:
    if size.cities < size.regions:
        raise ValueError(f"{size.cities} cities cannot give each of {size.regions} regions one")
    names = _Names(rng)
    entities: dict[str, Entity] = {}

    def add(kind: str, index: int, name: str, year: int = 0) -> Entity:
        entity = Entity(key=f"{kind}{index}", kind=kind, name=name, year=year)
        entities[entity.key] = entity
        return entity

    regions = [
        add("region", i, rng.choice(REGION_KINDS).format(names.word())) for i in range(size.regions)
    ]
    cities = [add("city", i, names.word()) for i in range(size.cities)]
    people = [
        add("person", i, f"{names.word()} {names.word()}", year=rng.randrange(1690, 1880))
        for i in range(size.people)
    ]
    orgs = []
    used_org_names: set[str] = set()
    for i in range(size.orgs):
        while True:  # an observatory is named after a city: two in one city would collide
            pattern, _ = rng.choice(ORG_KINDS)
            base = rng.choice(cities).name if "Observatory" in pattern else names.word()
            name = pattern.format(base)
            if name not in used_org_names:
                used_org_names.add(name)
                break
        orgs.append(add("org", i, name))
    events = []
    used_event_names: set[str] = set()
    for i in range(size.events):
        while True:
            pattern, _ = rng.choice(EVENT_KINDS)
            base = rng.choice(cities).name if pattern.startswith("Siege") else names.word()
            name = pattern.format(base)
            if name not in used_event_names:
                used_event_names.add(name)
                break
        events.append(add("event", i, name))

    for index, city in enumerate(cities):
        # The first cities go one to each region, so every region has a capital inside it.
        region = regions[index] if index < len(regions) else rng.choice(regions)
        city.relations["region"] = region.key
        city.relations["mayor"] = rng.choice(people).key
    for region in regions:
        own = [c for c in cities if c.relations["region"] == region.key]
        region.relations["capital"] = rng.choice(own).key
        region.relations["governor"] = rng.choice(people).key
    for person in people:
        person.relations["birthplace"] = rng.choice(cities).key
        person.relations["employer"] = rng.choice(orgs).key
        older = [p for p in rng.sample(people, 8) if p.year < person.year]
        person.relations["mentor"] = (
            older or [rng.choice([p for p in people if p is not person])]
        )[0].key
    for org in orgs:
        founder = rng.choice(people)
        org.relations["founder"] = founder.key
        org.relations["headquarters"] = rng.choice(cities).key
        leader = rng.choice([p for p in rng.sample(people, 4) if p is not founder])
        org.relations["leader"] = leader.key
        org.year = founder.year + rng.randrange(22, 60)
    for event in events:
        organiser = rng.choice(orgs)
        event.relations["organiser"] = organiser.key
        event.relations["host"] = rng.choice(cities).key
        event.year = organiser.year + rng.randrange(1, 80)
    return entities


def _value_name(entities: dict[str, Entity], entity: Entity, relation: str) -> str:
    if RELATIONS[entity.kind][relation].target == "year":
        return str(entity.year)
    return entities[entity.relations[relation]].name


def _describe(entities: dict[str, Entity], e: Entity, rng: random.Random) -> str:
    """The document text: one sentence per relation (with its pattern), then cross-references."""

    def name(key: str) -> str:
        return entities[key].name

    r = e.relations
    if e.kind == "person":
        field_name = rng.choice(FIELDS)
        sentences = [
            f"{e.name} was born in {name(r['birthplace'])} in {e.year}.",
            f"{e.name} works for the {name(r['employer'])}.",
            f"{e.name} was trained by {name(r['mentor'])}.",
            f"{e.name} is known for {rng.randrange(2, 30)} books on {field_name}.",
        ]
    elif e.kind == "city":
        sentences = [
            f"{e.name} is a city in the region {name(r['region'])}.",
            f"The mayor of {e.name} is {name(r['mayor'])}.",
            f"{e.name} stands on a {rng.choice(RIVERS)} river and has "
            f"{rng.randrange(3, 400)} thousand inhabitants.",
        ]
    elif e.kind == "region":
        sentences = [
            f"The capital of {e.name} is {name(r['capital'])}.",
            f"{e.name} is governed by {name(r['governor'])}.",
        ]
    elif e.kind == "org":
        sentences = [
            f"The {e.name} is headquartered in {name(r['headquarters'])}.",
            f"The {e.name} was founded by {name(r['founder'])} in {e.year}.",
            f"The {e.name} is led by {name(r['leader'])}.",
        ]
    else:
        sentences = [
            f"The {e.name} was held in {name(r['host'])} in {e.year}.",
            f"The {e.name} was organised by the {name(r['organiser'])}.",
            f"It drew {rng.randrange(2, 90)} hundred visitors.",
        ]
    mentions = e.facts[:3]
    return " ".join(sentences + mentions)


def _cross_references(entities: dict[str, Entity], rng: random.Random) -> None:
    """Sentences in one document that name other entities (distractors for search)."""
    for e in entities.values():
        r = e.relations
        if e.kind == "person":
            entities[r["birthplace"]].facts.append(f"Natives include {e.name}.")
            entities[r["employer"]].facts.append(f"Its staff include {e.name}.")
            entities[r["mentor"]].facts.append(f"Pupils include {e.name}.")
        elif e.kind == "org":
            entities[r["founder"]].facts.append(
                f"Early in life, {entities[r['founder']].name} set up the {e.name}."
            )
            entities[r["headquarters"]].facts.append(f"The {e.name} has offices here.")
        elif e.kind == "event":
            entities[r["organiser"]].facts.append(f"It arranged the {e.name}.")
            entities[r["host"]].facts.append(f"Visitors came for the {e.name}.")
    for e in entities.values():
        rng.shuffle(e.facts)


def _question(
    entities: dict[str, Entity], chain: list[tuple[Entity, str]], qid: str, split: str
) -> Question:
    start = chain[0][0]
    phrase = ("the " + start.name) if start.kind in ("org", "event") else start.name
    hops = []
    for entity, relation in chain:
        phrase = f"{RELATIONS[entity.kind][relation].phrase} {phrase}"
        hops.append(
            Hop(
                subject=entity.name,
                doc_id=entity.doc_id,
                pattern=RELATIONS[entity.kind][relation].pattern,
                answer=_value_name(entities, entity, relation),
            )
        )
    return Question(qid, f"What is {phrase}?", hops[-1].answer, split, hops=tuple(hops))


def _random_chain(
    entities: dict[str, Entity], starts: list[Entity], rng: random.Random, n_hops: int
) -> list[tuple[Entity, str]] | None:
    entity = rng.choice(starts)
    seen = {entity.key}
    chain: list[tuple[Entity, str]] = []
    for hop in range(n_hops):
        want_year = hop == n_hops - 1 and rng.random() < 0.2
        options = [
            name
            for name, relation in RELATIONS[entity.kind].items()
            if (relation.target == "year") == want_year
        ] or [
            name for name, relation in RELATIONS[entity.kind].items() if relation.target != "year"
        ]
        relation = rng.choice(options)
        chain.append((entity, relation))
        if RELATIONS[entity.kind][relation].target == "year":
            break
        entity = entities[entity.relations[relation]]
        if entity.key in seen:
            return None
        seen.add(entity.key)
    return chain


def generate_world(
    seed: int,
    n_train: int,
    n_heldout: int,
    min_hops: int = 2,
    max_hops: int = 4,
    size: WorldSize | None = None,
) -> tuple[list[Document], list[Question]]:
    """The documents and the questions (held-out first, then training) of world ``seed``."""
    if not 1 <= min_hops <= max_hops:
        raise ValueError(f"need 1 <= min_hops <= max_hops, got {min_hops} and {max_hops}")
    rng = random.Random(f"research-world-{seed}")
    entities = _build_entities(rng, size or WorldSize())
    _cross_references(entities, rng)
    ordered = list(entities.values())
    rng.shuffle(ordered)  # ids carry no hint of the kind
    documents = []
    for index, entity in enumerate(ordered):
        entity.doc_id = f"d{index:04d}"
    for entity in ordered:
        documents.append(Document(entity.doc_id, entity.name, _describe(entities, entity, rng)))
    documents.sort(key=lambda d: d.id)

    starts = ordered
    questions: list[Question] = []
    texts: set[str] = set()
    for split, count in (("heldout", n_heldout), ("train", n_train)):
        split_rng = random.Random(f"research-questions-{seed}-{split}")
        made = 0
        while made < count:
            chain = _random_chain(
                entities, starts, split_rng, split_rng.randint(min_hops, max_hops)
            )
            if chain is None:
                continue
            question = _question(entities, chain, f"{split}-{made:05d}", split)
            if question.question in texts:
                continue
            texts.add(question.question)
            questions.append(question)
            made += 1
    return documents, questions
