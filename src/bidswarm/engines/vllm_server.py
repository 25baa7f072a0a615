"""The vLLM side of ``model.engine=vllm``: a process in vLLM's own environment serving the
trainer (``engines/vllm_engine.py`` starts it and is its only client).

It runs with the interpreter of that environment (``make vllm``: ``.venv-vllm``), which holds
vLLM and the torch and transformers versions vLLM pins, and none of bidswarm's dependencies:
this file imports the standard library, torch, safetensors and vLLM only, and nothing of
bidswarm. It is started by its path (``python -I vllm_server.py``: isolated, so neither its
own folder nor the trainer's ``PYTHONPATH`` shadow a package).

One request at a time over a ``multiprocessing.connection`` socket that this process listens
on (authenticated by a key the trainer passes in ``BIDSWARM_ENGINE_KEY``); each message is a
dict of plain values and every reply is ``{"ok": True, ...}`` or
``{"ok": False, "error": <traceback>}``:

- ``start``: one vLLM engine (``vllm.LLM``, in this process) under a key, with dummy weights;
- ``load_weights``: a safetensors file into an engine, in place (vLLM's ``reload_weights``),
  then its prefix cache reset: cached keys and values of the old weights are never reused;
- ``generate``: token-id prompts, each with its seed and LoRA adapter (name, id, folder);
  each reply says how many of its prompt's tokens the prefix cache served;
- ``remove_loras``: adapters no longer served (a LoRA agent's older versions);
- ``shutdown``.

The process ends when the trainer's connection closes or the trainer dies (Linux: a
parent-death signal), however the trainer ended.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from multiprocessing.connection import Listener

KEY_VARIABLE = "BIDSWARM_ENGINE_KEY"
"""The environment variable that carries the connection's key (hex) to this process."""
READY = "ready"
"""The first message this process sends, once vLLM is imported."""


class Server:
    """The engines of this process, by key, and the requests they answer."""

    def __init__(self):
        import vllm

        self.vllm = vllm
        self.engines: dict[str, object] = {}

    def start(self, engine: str, model: str, options: dict) -> dict:
        started = time.perf_counter()
        self.engines[engine] = self.vllm.LLM(
            model=model,
            skip_tokenizer_init=True,
            load_format="dummy",  # the trainer's weights follow with load_weights
            logprobs_mode="processed_logprobs",  # at the sampling temperature, as the learner's
            enable_prefix_caching=True,
            **options,
        )
        return {"seconds": time.perf_counter() - started}

    def load_weights(self, engine: str, path: str) -> dict:
        from safetensors.torch import load_file

        started = time.perf_counter()
        llm = self.engines[engine]
        weights = load_file(path)
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
        llm.reset_prefix_cache()
        return {"seconds": time.perf_counter() - started}

    def generate(
        self,
        engine: str,
        prompts: list[list[int]],
        seeds: list[int | None],
        loras: list[list | None],
        max_tokens: int,
        temperature: float,
        stop: list[int],
    ) -> dict:
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        llm = self.engines[engine]
        params = [
            self.vllm.SamplingParams(
                temperature=temperature,
                max_tokens=max_tokens,
                seed=seed,
                logprobs=0,  # the sampled token's own
                stop_token_ids=stop,
                ignore_eos=not stop,  # no stop tokens: every reply runs to max_tokens
                detokenize=False,
            )
            for seed in seeds
        ]
        requests = None
        if any(lora is not None for lora in loras):
            requests = [LoRARequest(*lora) if lora is not None else None for lora in loras]
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts],
            params,
            lora_request=requests,
            use_tqdm=False,
        )
        replies = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [
                step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)
            ]
            cached = output.num_cached_tokens or 0  # prompt tokens its prefix cache served
            replies.append({"tokens": tokens, "logprobs": logprobs, "cached": cached})
        return {"replies": replies}

    def remove_loras(self, engine: str, ids: list[int]) -> dict:
        llm = self.engines[engine]
        for lora_id in ids:
            llm.llm_engine.remove_lora(lora_id)
        return {}


def end_with_the_trainer() -> None:
    """Ask Linux to send this process SIGTERM when the trainer that started it dies (even by
    SIGKILL, in the middle of a request); elsewhere the closed connection ends it."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() == 1:  # the trainer died before the call above
            sys.exit(0)


def serve(address: str) -> None:
    """Import vLLM, listen on ``address`` for the trainer, answer its requests until it
    closes the connection or asks to shut down."""
    end_with_the_trainer()
    key = bytes.fromhex(os.environ.pop(KEY_VARIABLE))
    server = Server()
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        connection = listener.accept()
    connection.send({"ok": True, READY: True, "pid": os.getpid()})
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        op = request.pop("op")
        if op == "shutdown":
            connection.send({"ok": True})
            return
        try:
            reply = getattr(server, op)(**request)
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        else:
            reply = {"ok": True, **reply}
        try:
            connection.send(reply)
        except (EOFError, OSError):
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the socket to listen on")
    args = parser.parse_args()
    serve(args.address)
    sys.exit(0)


if __name__ == "__main__":
    main()
