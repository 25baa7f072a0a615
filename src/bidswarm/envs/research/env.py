"""The deep-research environment: Searcher, Opener and Finder answer multi-hop questions.

Each decision step one agent uses its tool on a shared browser (one open page, the last search
results, notes of the facts found so far). ``answer(text)`` ends the episode with a binary
reward from the judge; otherwise the episode ends when the decision budget is spent.

Everything that decides the future is plain data in ``self._state`` (question, open page and
its offset, last results, notes, counters); the corpus, its BM25 index and the judge are
immutable and shared by every environment of the process. Nothing random happens after
``reset``: the question comes from the seed and the tools are deterministic. One module over
400 lines on purpose: the three tools, the browser state they share and its observation are
one world; the corpus, the search index and the judge live apart.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from bidswarm.envs.base import StepResult, TextEnv, register_task, role_name
from bidswarm.envs.quoting import quote
from bidswarm.envs.research import shared
from bidswarm.envs.research.config import ResearchConfig
from bidswarm.envs.research.corpus import (
    Document,
    Question,
    check_unique_ids,
    read_documents,
    read_questions,
)
from bidswarm.envs.research.judge import HttpJudge, MatchJudge
from bidswarm.envs.research.search import SearchIndex
from bidswarm.envs.research.tools import (
    TOOL_OWNERS,
    ToolCall,
    find_in_text,
    page_count,
    page_text,
    parse_call,
    snippet,
    truncate_words,
)
from bidswarm.envs.research.world import generate_world

MAX_OBSERVATION_WORDS = 79
NOTE_WORDS = 14
MESSAGE_WORDS = 12
TITLE_WORDS = 6
FIND_MATCHES_SHOWN = 2
EXPERT_BID = 0.8
ALTERNATIVE_BID = 0.6
"""With ``task.open_order`` or ``task.open_hops``: the bid of a step that moves the question on
the longer way."""
SEARCH_CALL = re.compile(r"browser\.search\((.*)\)$")
"""A search call on the ``Team`` line (lower case), and its query."""

ROLE_TOOLS = {
    "searcher": "browser.search(query): ranked ids, titles and snippets of corpus pages",
    "opener": "browser.open(id): open a page by id (d0412) or search rank (1); "
    "browser.open(id, n) shows its page n",
    "finder": "browser.find(pattern): sentences of the open page holding the words; "
    "answer(text): give the final answer (ends the episode)",
}


@dataclass(frozen=True)
class ResearchData:
    """What every environment of one config shares: corpus, index and questions (read-only)."""

    documents: list[Document]
    position: dict[str, int]
    index: SearchIndex
    train: list[Question]
    heldout: list[Question]


_SHARED: dict[tuple, ResearchData] = {}


def _file_key(path: str | None) -> tuple:
    if path is None:
        return (None,)
    stat = Path(path).stat()
    return (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


def index_cache_dir(config: ResearchConfig) -> Path:
    """Where the BM25 index is saved: ``task.cache_dir``, or by default the user's cache folder
    (``$XDG_CACHE_HOME/bidswarm/research``, ``~/.cache/bidswarm/research`` when unset), never
    the working directory of whoever builds the env."""
    if config.cache_dir is not None:
        return Path(config.cache_dir).expanduser().resolve()
    home_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(home_cache).resolve() / "bidswarm" / "research"


def load_research_data(config: ResearchConfig) -> ResearchData:
    """Corpus, questions and index of ``config``, built once per process (index cached on disk)."""
    key = (
        _file_key(config.corpus_path),
        _file_key(config.questions_path),
        config.world_seed,
        astuple(config.world_size),
        config.n_train_seeds,
        config.n_heldout_seeds,
        config.min_hops,
        config.max_hops,
        config.search_char_ngrams,
        str(index_cache_dir(config)),
    )
    if key in _SHARED:
        return _SHARED[key]
    if config.corpus_path is None or config.questions_path is None:
        documents, questions = generate_world(
            config.world_seed,
            config.n_train_seeds,
            config.n_heldout_seeds,
            config.min_hops,
            config.max_hops,
            config.world_size,
        )
    else:
        documents = read_documents(config.corpus_path)
        questions = read_questions(config.questions_path)
    check_unique_ids(documents)
    position = {document.id: i for i, document in enumerate(documents)}
    train = [q for q in questions if q.split == "train"]
    heldout = [q for q in questions if q.split == "heldout"]
    if not train:
        raise ValueError("the questions have no 'train' split; training seeds need one")
    if len(heldout) < config.n_heldout_seeds:
        raise ValueError(
            f"task.n_heldout_seeds={config.n_heldout_seeds} but only {len(heldout)} held-out "
            "questions exist; lower task.n_heldout_seeds"
        )
    for question in questions:
        for hop in question.hops:
            if hop.doc_id not in position:
                raise ValueError(f"question {question.id}: hop document {hop.doc_id!r} is unknown")
    data = ResearchData(
        documents,
        position,
        SearchIndex.cached(documents, index_cache_dir(config), config.search_char_ngrams),
        train,
        heldout[: config.n_heldout_seeds],
    )
    _SHARED[key] = data
    return data


def _is_number(text: str) -> bool:
    """Whether ``int(text)`` reads a model's reply: decimal digits only (``isdigit`` also
    accepts ``²``, which ``int`` refuses), and few (``int`` refuses more than 4300)."""
    return text.isdecimal() and len(text) <= 9


@register_task("research")
class ResearchEnv(TextEnv):
    """Multi-hop question answering over an offline corpus with three browser roles."""

    Config = ResearchConfig
    roles = ("searcher", "opener", "finder")

    def __init__(self, config: ResearchConfig):
        super().__init__(config)
        self.config: ResearchConfig = config
        self.data = load_research_data(config)
        match = MatchJudge(config.f1_threshold)
        self.judge: MatchJudge | HttpJudge = match
        if config.judge == "llm":
            if config.judge_api_key_env and config.judge_api_key_env not in os.environ:
                raise ValueError(
                    f"task.judge_api_key_env names {config.judge_api_key_env!r}, which is not "
                    "set in the environment"
                )
            self.judge = HttpJudge(
                url=str(config.judge_url),
                model=str(config.judge_model),
                fallback=match,
                api_key_env=config.judge_api_key_env,
                retries=config.judge_retries,
                timeout_s=config.judge_timeout_s,
            )
        self._state: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the shared corpus and index (``data``): a pickle (a vector env's
        worker, a deep copy) holds the config and the episode, and loads the data on arrival
        (:func:`load_research_data`: once per process, the index from its cache folder)."""
        return {key: value for key, value in self.__dict__.items() if key != "data"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.data = load_research_data(self.config)

    # -- seeds and prompts ---------------------------------------------------------------------
    def question_for_seed(self, seed: int) -> Question:
        """Held-out seeds (from ``heldout_seed_offset``) ask held-out questions, others training."""
        offset = self.config.heldout_seed_offset
        if seed >= offset:
            return self.data.heldout[(seed - offset) % len(self.data.heldout)]
        return self.data.train[seed % len(self.data.train)]

    @property
    def task_description(self) -> str:
        return (
            "Answer the question from an offline corpus. Search for the entity the question "
            "starts from, open its page, find the fact that leads to the next entity, repeat, "
            "then answer with the final name or number."
        )

    def role_description(self, role: str | None) -> str:
        if role is None:
            return "You own every tool. " + "; ".join(ROLE_TOOLS.values()) + "." + self.memory_hint
        if role not in ROLE_TOOLS:
            raise ValueError(f"unknown role {role!r}; roles are {self.roles}")
        return f"You are the {role}. Your tools: {ROLE_TOOLS[role]}." + self.memory_hint

    def vocabulary_texts(self) -> list[str]:
        """Every page of the corpus: a tokenizer built for a model trained from scratch then
        knows the names of held-out questions too (one piece per name word, vocabulary
        allowing), not only those of the demonstrations."""
        return [f"{document.title}. {document.text}" for document in self.data.documents]

    # -- episode -------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        seed = self.begin_episode(seed)
        question = self.question_for_seed(seed)
        self._state = {
            "question_id": question.id,
            "heldout": seed >= self.config.heldout_seed_offset,
            "question_index": self._question_index(seed),
            "decisions": 0,
            "done": False,
            "open_doc": None,
            "page": 0,
            "last_result": "nothing yet",
            "last_was_find": False,
            "message": "",
            "notes": [],
            "results": [],
            "last_query": "",
            "hops_found": 0,
            "answer": None,
            "success": False,
            "f1": 0.0,
            "reward": 0.0,
            "invalid_turns": 0,
            "judge_failures": 0,
            "last_call": "",
            "last_caller": None,
        }
        if self.config.actions == "shared":
            self._state["tools"] = shared.draw_tools(seed, self.roles)
        self.memory.clear()

    def _question_index(self, seed: int) -> int:
        offset = self.config.heldout_seed_offset
        if seed >= offset:
            return (seed - offset) % len(self.data.heldout)
        return seed % len(self.data.train)

    @property
    def question(self) -> Question:
        split = self.data.heldout if self._state["heldout"] else self.data.train
        return split[self._state["question_index"]]

    def screen(self, role: str | None) -> str:
        """Question, turn, open page (id, title), facts found, notes, last tool result and
        message: < 80 words with the memory's notes. The browser is shared: every role sees the
        same screen, except with ``private_results``: then ``Team`` says which call was made last,
        ``Last`` shows its result only to the role that made it (and to the monolithic agent,
        who owns every tool), and the facts found are not listed."""
        s = self._state
        page = "none"
        if s["open_doc"] is not None:
            document = self.data.documents[s["open_doc"]]
            total = page_count(document.text, self.config.page_words)
            title = truncate_words(document.title, TITLE_WORDS)
            page = f"{document.id} {title} p{s['page'] + 1}/{total}"
        head = [
            f"Q: {self.question.question}",
            f"Turn {s['decisions'] + 1}/{self.config.max_decisions}. Page: {page}. "
            f"Facts: {len(s['notes'])}.",
        ]
        last = s["last_result"]
        if self.config.private_results:
            if s["last_call"]:
                head.append(f"Team: {s['last_call']}")
            if role is not None and role != s["last_caller"]:
                last = "nothing new"
        else:
            notes = s["notes"][:-1] if s["last_was_find"] else s["notes"]
            if notes:
                head.append(f"Notes: {truncate_words(notes[-1], NOTE_WORDS)}")
        if "tools" in s and role is not None:
            head.append(shared.tools_line(s["tools"], role))
        tail = [f"Msg: {truncate_words(s['message'], MESSAGE_WORDS)}"] if s["message"] else []
        used = sum(len(line.split()) for line in head + tail) + 1 + self._memo_words()
        last = truncate_words(last, max(MAX_OBSERVATION_WORDS - used, 4))
        return "\n".join([*head, f"Last: {last}", *tail])

    def _memo_words(self) -> int:
        """Words the memory's line can take: ``Memo:``, and per note its writer, its words and
        a separator."""
        if not self.memory.enabled:
            return 0
        memory = self.config.memory
        return 1 + memory.top_k * (memory.note_words + 2)

    def note_turn(self, actor_role: str | None) -> StepResult:
        self.require_running("step()")
        s = self._state
        s["decisions"] += 1
        s["message"] = ""
        s["last_call"] = f"{role_name(actor_role)} wrote a note"
        s["last_caller"] = actor_role
        self._end_if_out_of_budget()
        return StepResult(0.0, s["done"], valid=True)

    def act(self, actor_role: str | None, action: str) -> StepResult:
        self.require_running("step()")
        s = self._state
        s["decisions"] += 1
        s["message"] = ""
        call = parse_call(action)
        if isinstance(call, str):
            return self._wasted(call)
        if "tools" in s and actor_role not in (None, s["tools"][call.tool]):
            return self._wasted(shared.broken(actor_role, call.tool))
        owner = TOOL_OWNERS[call.tool]
        if "tools" not in s and actor_role is not None and actor_role != owner:
            return self._wasted(f"{actor_role} cannot use {call.tool}; the {owner} owns it")
        reward = 0.0
        if call.tool == "browser.search":
            outcome = self._search(call)
        elif call.tool == "browser.open":
            outcome = self._open(call)
        elif call.tool == "browser.find":
            outcome = self._find(call)
        else:
            reward = self._answer(call)
            outcome = None
        if outcome is not None:
            return self._wasted(outcome)
        argument = quote(call.argument, MESSAGE_WORDS)
        s["last_call"] = f"{role_name(actor_role)} {call.tool}({argument})"
        s["last_caller"] = actor_role
        self._end_if_out_of_budget()
        return StepResult(reward, s["done"], valid=True)

    def skip(self) -> StepResult:
        self.require_running("skip()")
        s = self._state
        s["decisions"] += 1
        s["message"] = ""
        self._end_if_out_of_budget()
        return StepResult(0.0, s["done"])

    @property
    def decisions_made(self) -> int:
        return self._state["decisions"]

    @property
    def done(self) -> bool:
        return self._state["done"]

    def episode_metrics(self) -> dict[str, float]:
        self.require_started("episode_metrics()")
        s = self._state
        return {
            "success": float(s["success"]),
            "f1": float(s["f1"]),
            "reward": float(s["reward"]),
            "decisions": float(s["decisions"]),
            "judge_failures": float(s["judge_failures"]),
            "invalid_turns": float(s["invalid_turns"]),
            "hops_found": float(s["hops_found"]),
        } | (self.memory.metrics() if self.memory.enabled else {})

    # -- tools ---------------------------------------------------------------------------------
    def _wasted(self, message: str) -> StepResult:
        self._state["message"] = message
        self._state["invalid_turns"] += 1
        self._end_if_out_of_budget()
        return StepResult(0.0, self._state["done"], valid=False, message=message)

    def _end_if_out_of_budget(self) -> None:
        if self._state["decisions"] >= self.config.max_decisions:
            self._state["done"] = True

    def _search(self, call: ToolCall) -> str | None:
        hits = self.data.index.search(call.argument, self.config.search_top_k)
        s = self._state
        if self.config.open_hops:
            self._note_followed_snippet(call.argument)
        s["results"] = [position for position, _ in hits]
        s["last_query"] = call.argument
        s["last_was_find"] = False
        if not hits:
            s["last_result"] = f'search "{quote(call.argument)}": no results'
            return None
        shown = []
        for rank, (position, _) in enumerate(hits, start=1):
            document = self.data.documents[position]
            shown.append(
                f"[{rank}] {document.id} {document.title}: {snippet(document.title, document.text)}"
            )
        s["last_result"] = f'search "{quote(call.argument)}": ' + "; ".join(shown)
        return None

    def _open(self, call: ToolCall) -> str | None:
        s = self._state
        target, _, page_arg = call.argument.partition(",")
        target = target.strip().strip("\"'")
        if _is_number(target):
            rank = int(target)
            if not 1 <= rank <= len(s["results"]):
                return f"no search result [{rank}]; search first or open a page id"
            position = s["results"][rank - 1]
        elif target in self.data.position:
            position = self.data.position[target]
        else:
            return f"no page {truncate_words(quote(target), 3)} in the corpus"
        document = self.data.documents[position]
        total = page_count(document.text, self.config.page_words)
        page = 1
        if page_arg.strip():
            if not _is_number(page_arg.strip()) or not 1 <= int(page_arg) <= total:
                return f"{document.id} has pages 1 to {total}"
            page = int(page_arg)
        s["open_doc"], s["page"], s["last_was_find"] = position, page - 1, False
        text = page_text(document.text, page - 1, self.config.page_words)
        s["last_result"] = f"open {document.id} {document.title} p{page}/{total}: {text}"
        return None

    def _find(self, call: ToolCall) -> str | None:
        s = self._state
        if s["open_doc"] is None:
            return "no page is open; the opener opens one first"
        document = self.data.documents[s["open_doc"]]
        matches = find_in_text(document.text, call.argument, self.config.page_words)
        s["last_was_find"] = bool(matches)
        if not matches:
            s["last_result"] = f'find "{quote(call.argument)}" in {document.id}: no match'
            return None
        shown = matches[:FIND_MATCHES_SHOWN]
        s["notes"].append(shown[0][1])
        s["last_result"] = f'find "{quote(call.argument)}" in {document.id}: ' + " ".join(
            f"[p{page + 1}] {sentence}" for page, sentence in shown
        )
        self._track_hop(document, [sentence for _, sentence in shown])
        return None

    def _note_followed_snippet(self, query: str) -> None:
        """With ``open_hops``: a search for a name that a snippet of the search results on
        screen shows notes that result's line (``Brennik Talor: was born in Ygrad``) as a fact,
        the first such result by rank: the team moved on from it, so ``Facts`` and ``Notes``
        show the hop reached, as a found fact would."""
        s = self._state
        if not s["last_result"].startswith('search "') or not query.strip():
            return
        name = re.compile(rf"(?<!\w){re.escape(query.strip())}(?!\w)", re.IGNORECASE)
        for position in s["results"]:
            document = self.data.documents[position]
            shown = snippet(document.title, document.text)
            match = name.search(shown)
            if match is not None and match[0][0].isupper():
                line = f"{document.title}: {shown}"
                s["notes"].append(line)
                self._track_hop(document, [line])
                return

    def _track_hop(self, document: Document, shown: list[str]) -> None:
        """Count the gold hop as found when its fact is on screen (the ``hops_found`` metric;
        the experts go by the facts found that the screen shows instead)."""
        hops = self.question.hops
        found = self._state["hops_found"]
        if found < len(hops) and document.id == hops[found].doc_id:
            answer = hops[found].answer.lower()
            if any(answer in sentence.lower() for sentence in shown):
                self._state["hops_found"] = found + 1

    def _answer(self, call: ToolCall) -> float:
        s = self._state
        question = self.question
        verdict = self.judge.judge(
            question.question, call.argument, [question.answer, *question.aliases]
        )
        reward = 1.0 if verdict.success else 0.0
        s.update(
            answer=call.argument,
            success=verdict.success,
            f1=verdict.f1,
            reward=s["reward"] + reward,
            done=True,
            last_was_find=False,
            last_result=f'answered "{truncate_words(quote(call.argument), 8)}"',
        )
        s["judge_failures"] += int(verdict.judge_failed)
        return reward

    # -- fork contract -------------------------------------------------------------------------
    def fork_state(self) -> dict[str, Any]:
        return {"state": copy.deepcopy(self._state), "memory": self.memory.state()}

    def load_fork_state(self, state: dict[str, Any]) -> None:
        self._state = copy.deepcopy(state["state"])
        self.memory.load(state["memory"])

    # -- scripted experts ----------------------------------------------------------------------
    def _next_expert_step(self) -> tuple[str, str] | None:
        """(role, reply) of the next step along the question's chain, decided from the screen.

        The gold chain (``question.hops``) only picks among what the observation shows: the
        hop reached is the number of facts found (``Facts: n``), never the hidden gold
        progress; its subject is in the question (first hop) or in the latest fact (``Last`` or
        ``Notes``); the subject's page is opened by its rank in the search results shown, and
        searched in once ``Page`` names it; the find pattern is the relation the question asks
        (one fixed word per relation in the generated world); the answer is in the latest fact.
        An expert never types a name that is not on screen, nor opens a page by an id the
        screen does not list: then it has nothing to do (None).
        """
        s = self._state
        if s["done"]:
            return None
        hops = self.question.hops
        if not hops:
            return self._next_step_without_hops()
        screen = self.observation(None).lower()
        found = len(s["notes"])
        if self.memory.enabled and 0 < found < len(hops):
            # The Finder notes the fact it just found for the steps after [ours].
            value = hops[found - 1].answer.lower()
            if value in _line(screen, "last: ") and value not in _line(screen, "memo: "):
                return "finder", f"note: {hops[found - 1].answer}"
        if found >= len(hops):
            answer = hops[-1].answer
            return ("finder", f"answer({answer})") if answer.lower() in screen else None
        hop = hops[found]
        if hop.subject.lower() not in screen:
            return None
        position = self.data.position[hop.doc_id]
        if s["open_doc"] == position:
            return "finder", f"browser.find({hop.pattern})"
        if s["last_result"].startswith(f'search "{hop.subject}":'):
            rank = s["results"].index(position) + 1 if position in s["results"] else 0
            if f"[{rank}] {hop.doc_id}".lower() not in screen:
                return None
            return "opener", f"browser.open({rank})"
        return "searcher", f"browser.search({hop.subject})"

    def _next_step_without_hops(self) -> tuple[str, str] | None:
        s = self._state
        if not s["last_query"]:
            return "searcher", f"browser.search({self.question.question})"
        if s["open_doc"] is None and s["results"]:
            return "opener", "browser.open(1)"
        return None

    def _private_expert_reply(self, role: str | None) -> str | None:
        """With ``private_results``: ``role``'s next reply, decided from its own observation
        (the monolithic agent: the first of the Finder's, Searcher's and Opener's rules that
        applies to its view). The hop reached is ``Facts``; its subject is in the question
        (first hop) or in the memo (a later one: the Finder noted it); the Opener opens the top
        search result once ``Team`` shows a search for a page that is not open; the Finder finds
        on the subject's page, notes what it found (``Last``) unless the memo shows it, and
        answers from ``Last``."""
        s = self._state
        hops = self.question.hops
        if s["done"] or not hops:
            return None
        screen = self.observation(role).lower()
        last, memo = _line(screen, "last: "), _line(screen, "memo: ")
        found = len(s["notes"])
        rules: list[str | None] = []
        if role in ("finder", None):
            if found == len(hops):
                answer = hops[-1].answer
                rules.append(f"answer({answer})" if answer.lower() in last else None)
            elif s["open_doc"] == self.data.position[hops[found].doc_id]:
                rules.append(f"browser.find({hops[found].pattern})")
            elif found and hops[found - 1].answer.lower() in last:
                value = hops[found - 1].answer
                rules.append(None if value.lower() in memo else f"note: {value}")
        team = _line(screen, "team: ")
        page = s["open_doc"]
        if role in ("searcher", None) and found < len(hops):
            subject = hops[found].subject
            where = _line(screen, "q: ") if found == 0 else memo
            searched = team.endswith(f"browser.search({subject.lower()})")
            opened = page == self.data.position[hops[found].doc_id]
            if subject.lower() in where and not searched and not opened:
                rules.append(f"browser.search({subject})")
        if role in ("opener", None) and found < len(hops):
            query = SEARCH_CALL.search(team)
            title = self.data.documents[page].title.lower() if page is not None else None
            if query is not None and query[1] != title:
                rules.append("browser.open(1)")
        return next((rule for rule in rules if rule is not None), None)

    def _snippet_shortcut(self) -> tuple[str, str] | None:
        """(role, reply) that moves the question on from a search result's snippet, when the
        results on screen show the current hop's page with a snippet that holds the hop's value
        (e.g. ``[2] d0412 Brennik Talor: was born in Ygrad``) and that page is not open: at the
        last hop with ``open_order`` the Finder's ``answer(<value>)``, at an earlier hop with
        ``open_hops`` the Searcher's ``browser.search(<value>)`` (the next hop's subject);
        None otherwise."""
        s = self._state
        hops = self.question.hops
        hop = len(s["notes"])
        last = hop == len(hops) - 1
        if (
            s["done"]
            or hop >= len(hops)
            or not (self.config.open_order if last else self.config.open_hops)
        ):
            return None
        if not s["last_result"].startswith('search "'):
            return None
        position = self.data.position[hops[hop].doc_id]
        if position not in s["results"] or s["open_doc"] == position:
            return None
        document = self.data.documents[position]
        shown = snippet(document.title, document.text)
        rank = s["results"].index(position) + 1
        line = f"[{rank}] {document.id} {document.title}: {shown}".lower()
        value = hops[hop].answer
        if value.lower() not in shown.lower() or line not in self.observation(None).lower():
            return None
        return ("finder", f"answer({value})") if last else ("searcher", f"browser.search({value})")

    def _expert_steps(self) -> dict[str, tuple[float, str]]:
        """Role -> (its expert bid, its reply) for every role whose step moves the question on
        now; empty: the experts skip. The chain's next step is its owner's at ``EXPERT_BID``;
        where a snippet on screen lets the question move on at once (:meth:`_snippet_shortcut`:
        the answer with ``open_order``, the next hop's search with ``open_hops``) that step is
        its tool owner's at ``EXPERT_BID`` and the chain's step becomes the longer way at
        ``ALTERNATIVE_BID`` (one role owning both takes the shorter)."""
        if self.config.private_results:
            return {
                role: (EXPERT_BID, reply)
                for role in self.roles
                if (reply := self._private_expert_reply(role)) is not None
            }
        step = self._next_expert_step()
        if step is None:
            return {}
        shortcut = self._snippet_shortcut()
        if shortcut is None:
            return {self._expert_owner(step): (EXPERT_BID, step[1])}
        return {
            self._expert_owner(step): (ALTERNATIVE_BID, step[1]),
            self._expert_owner(shortcut): (EXPERT_BID, shortcut[1]),
        }

    def expert_action(self, role: str | None) -> str | None:
        if role is None and self.config.private_results:
            return self._private_expert_reply(None)
        steps = self._expert_steps()
        if role is None:
            return max(steps.values(), default=(0.0, None))[1]
        return steps[role][1] if role in steps else None

    def expert_bid(self, role: str) -> float:
        return self._expert_steps().get(role, (0.0, ""))[0]

    def _expert_owner(self, step: tuple[str, str]) -> str:
        """Who takes an expert step: its tool's owner (shared actions: whose call of the tool
        works in this world)."""
        if "tools" in self._state:
            return self._state["tools"][shared.tool_of(step[1])]
        return step[0]


def _line(screen: str, prefix: str) -> str:
    """The line of ``screen`` that starts with ``prefix`` ("" when there is none)."""
    return next((line for line in screen.splitlines() if line.startswith(prefix)), "")
