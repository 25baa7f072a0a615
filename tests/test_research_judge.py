"""Judges of the research task: exact match / token F1, and the LLM judge over HTTP.

The HTTP judge talks to a small OpenAI-compatible server on 127.0.0.1 started by the test.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bidswarm.envs.research import ResearchConfig, ResearchEnv
from bidswarm.envs.research.judge import (
    HttpJudge,
    MatchJudge,
    exact_match,
    normalize_answer,
    token_f1,
)

KEY_VARIABLE = "BIDSWARM_TEST_JUDGE_KEY"


class JudgeServer:
    """A chat-completions endpoint whose replies the test scripts (status code, text)."""

    def __init__(self):
        self.replies: list[tuple[int, str]] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body})
                server.headers.append(dict(self.headers))
                status, text = server.replies.pop(0) if server.replies else (200, "CORRECT")
                payload = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # keep test output quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    running = JudgeServer()
    yield running
    running.close()


def http_judge(url: str, **kwargs) -> HttpJudge:
    return HttpJudge(url, "judge-model", MatchJudge(0.8), retry_wait_s=0.0, **kwargs)


# -- match judge ---------------------------------------------------------------------------------
def test_normalisation_exact_match_and_f1():
    assert normalize_answer("  The Krehou-Guild! ") == "krehouguild"
    assert exact_match("the Giomgraend Press", "Giomgraend Press.")
    assert not exact_match("Giomgraend", "Giomgraend Press")
    assert token_f1("Giomgraend", "Giomgraend Press") == pytest.approx(2 / 3)
    assert token_f1("Press Giomgraend", "Giomgraend Press") == 1.0
    assert token_f1("", "Giomgraend Press") == 0.0 and token_f1("", "") == 1.0


def test_match_judge_threshold_and_aliases():
    half = MatchJudge(0.6).judge("q", "Giomgraend", ["Giomgraend Press"])
    assert half.success and half.f1 == pytest.approx(2 / 3)
    strict = MatchJudge(0.8).judge("q", "Giomgraend", ["Giomgraend Press"])
    assert not strict.success and not strict.judge_failed
    assert MatchJudge(1.0).judge("q", "GP", ["Giomgraend Press", "gp"]).success


# -- HTTP judge ----------------------------------------------------------------------------------
def test_http_judge_asks_the_endpoint_and_follows_its_verdict(server, monkeypatch):
    monkeypatch.setenv(KEY_VARIABLE, "sk-test-secret")
    judge = http_judge(server.url, api_key_env=KEY_VARIABLE)
    server.replies = [(200, "CORRECT"), (200, " incorrect.")]
    accepted = judge.judge("What is x?", "Giomgraend", ["Giomgraend Press"])
    assert accepted.success and not accepted.judge_failed  # the LLM overrules the F1 threshold
    assert accepted.f1 == pytest.approx(2 / 3)
    rejected = judge.judge("What is x?", "Giomgraend Press", ["Giomgraend Press"])
    assert not rejected.success and not rejected.judge_failed
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 2
    sent = server.requests[0]["body"]
    assert sent["model"] == "judge-model" and "What is x?" in sent["messages"][0]["content"]
    assert server.headers[0]["Authorization"] == "Bearer sk-test-secret"


def test_http_judge_retries_then_falls_back_and_counts(server):
    judge = http_judge(server.url, retries=2)
    server.replies = [(500, "oops"), (200, "maybe")]
    recovered = judge.judge("q", "Giomgraend Press", ["Giomgraend Press"])
    assert len(server.requests) == 3 and recovered.success and not recovered.judge_failed
    server.requests.clear()
    server.replies = [(500, "down")] * 3
    fallen = judge.judge("q", "Giomgraend Press", ["Giomgraend Press"])
    assert len(server.requests) == 3
    assert fallen.judge_failed and fallen.success  # decided by exact match
    assert "Authorization" not in server.headers[0]  # no key variable named, no header


def test_http_judge_survives_an_unreachable_endpoint():
    probe = JudgeServer()
    url = probe.url
    probe.close()  # nothing listens on that port any more
    verdict = http_judge(url, retries=1, timeout_s=2.0).judge("q", "a", ["b"])
    assert verdict.judge_failed and not verdict.success


def test_env_counts_judge_failures_and_keeps_the_key_out_of_config(server, monkeypatch, tmp_path):
    monkeypatch.setenv(KEY_VARIABLE, "sk-never-logged")
    config = ResearchConfig(
        cache_dir=str(tmp_path),
        judge="llm",
        judge_url=server.url,
        judge_model="judge-model",
        judge_api_key_env=KEY_VARIABLE,
        judge_retries=0,
    )
    env = ResearchEnv(config)
    server.replies = [(503, "busy")]
    env.reset(0)
    result = env.step("finder", f"answer({env.question.answer})")
    assert result.valid and result.done and result.reward == 1.0
    metrics = env.episode_metrics()
    assert metrics["judge_failures"] == 1.0 and metrics["success"] == 1.0
    server.replies = [(200, "INCORRECT")]
    env.reset(1)
    assert env.step("finder", f"answer({env.question.answer})").reward == 0.0
    assert env.episode_metrics()["judge_failures"] == 0.0
    assert server.headers[-1]["Authorization"] == "Bearer sk-never-logged"
    visible = repr(config) + json.dumps(env.snapshot()) + env.observation(None)
    assert "sk-never-logged" not in visible


def test_a_named_but_unset_key_variable_fails_early(tmp_path):
    config = ResearchConfig(
        cache_dir=str(tmp_path),
        judge="llm",
        judge_url="http://127.0.0.1:9/v1",
        judge_model="m",
        judge_api_key_env="BIDSWARM_TEST_UNSET_KEY",
    )
    with pytest.raises(ValueError, match="BIDSWARM_TEST_UNSET_KEY"):
        ResearchEnv(config)
