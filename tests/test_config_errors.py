"""Every bad config value is refused before a folder, a model or an env is made, and the
message names the key, the value and what is allowed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bidswarm.algorithms.credit import CREDIT_RULES
from bidswarm.config import (
    ConfigError,
    check_machine,
    machine,
    refuse_misspelled_keys,
    refuse_unknown_choices,
    register_configs,
    validate,
)
from bidswarm.coordination import RULES
from conftest import CONF, ROOT

register_configs()

# (overrides, the key named, the value as the message writes it, words of what is allowed)
INVALID = [
    (["seed=-1"], "seed", "-1", "0 .. 4294967295"),
    (["seed=4294967296"], "seed", "4294967296", "0 .. 4294967295"),
    # task
    (["task.max_decisions=0"], "task.max_decisions", "0", ">= 1"),
    (["task.n_train_seeds=0"], "task.n_train_seeds", "0", ">= 1"),
    (["task.n_heldout_seeds=-3"], "task.n_heldout_seeds", "-3", ">= 1"),
    (["task.heldout_seed_offset=10"], "task.heldout_seed_offset", "10", "disjoint"),
    (
        ["task=crafting_torch", "task.target=diamond_sword"],
        "task.target",
        "'diamond_sword'",
        "choose one of",
    ),
    (["task.expert_bids=loud"], "task.expert_bids", "'loud'", "graded"),
    (["task.history_length=-1"], "task.history_length", "-1", ">= 0"),
    (["task.frames_per_hardness=0"], "task.frames_per_hardness", "0.0", "> 0"),
    (["task=navigation_r2r", "task.door_width=9"], "task.door_width", "9.0", "min_room_size"),
    (
        ["task=navigation_r2r", "task.extra_door_probability=1.5"],
        "task.extra_door_probability",
        "1.5",
        "[0, 1]",
    ),
    (
        ["task=navigation_r2r", "task.min_route_rooms=5"],
        "task.min_route_rooms",
        "5",
        "max_route_rooms",
    ),
    (["task=navigation_r2r", "task.success_distance=-1"], "task.success_distance", "-1.0", "> 0"),
    (["task=research", "task.judge=vibes"], "task.judge", "'vibes'", "'match' or 'llm'"),
    (
        [
            "task=research",
            "task.judge=llm",
            "task.judge_url=localhost:8000/v1",
            "task.judge_model=m",
        ],
        "task.judge_url",
        "'localhost:8000/v1'",
        "http://",
    ),
    (["task=research", "task.min_hops=5"], "task.min_hops", "5", "min_hops <= max_hops"),
    # model
    (["model.tiny.hidden_size=63"], "model.tiny.hidden_size", "63", "multiple of"),
    (["model.tiny.num_layers=0"], "model.tiny.num_layers", "0", ">= 1"),
    (
        ["model.tiny.max_position_embeddings=100"],
        "model.tiny.max_position_embeddings",
        "100",
        "longest sequence",
    ),
    (["model.temperature=0"], "model.temperature", "0.0", "> 0"),
    (["model.max_bid_tokens=0"], "model.max_bid_tokens", "0", ">= 1"),
    (["model.max_action_tokens=-5"], "model.max_action_tokens", "-5", ">= 1"),
    (["model.dtype=float8"], "model.dtype", "'float8'", "float32"),
    (["model.prompt_style=chat"], "model.prompt_style", "'chat'", "compact"),
    (["model.source=hub"], "model.path", "None", "source=hub"),
    (["model.torch_threads=0"], "model.torch_threads", "0", ">= 1"),
    (
        ["model.engine=vllm", "model.vllm.block_size=40"],
        "model.vllm.block_size",
        "40",
        "multiple of 16",
    ),
    (["model.engine=vllm", "model.vllm.block_size=0"], "model.vllm.block_size", "0", "positive"),
    (["model=smollm2_135m", "model.gguf_file=null"], "model.gguf_file", "None", "source=gguf"),
    # coordination and credit
    (
        ["coordination.bid_levels=[0,0.5,1.2]"],
        "coordination.bid_levels",
        "[0.0, 0.5, 1.2]",
        "[0, 1]",
    ),
    (["coordination.bid_levels=[0.2,0.4]"], "coordination.bid_levels", "[0.2, 0.4]", "include 0"),
    (["coordination.bid_levels=[0]"], "coordination.bid_levels", "[0.0]", "above 0"),
    (
        ["coordination.bid_levels=[0,0.21,0.24]"],
        "coordination.bid_levels",
        "[0.0, 0.21, 0.24]",
        "one decimal",
    ),
    (["coordination.replicas=0"], "coordination.replicas", "0", ">= 1"),
    (
        ["coordination=monolithic", "coordination.replicas=2"],
        "coordination.replicas",
        "2",
        "must be 1",
    ),
    (["coordination.name=dictator"], "coordination.name", "'dictator'", "auction"),
    (["credit.name=magic"], "credit.name", "'magic'", "bucket_brigade"),
    (["bids=paper", "bids.balanced=true"], "bids.balanced", "True", "only a level reader"),
    (["bids=paper", "bids.anchor_target=levels"], "bids.anchor_target", "levels", "no anchor"),
    (["bids.anchor_target=labels"], "bids.anchor_target", "labels", "expert"),
    # trainer and logger
    (["trainer.accelerator=tpu"], "trainer.accelerator", "'tpu'", "cpu"),
    (["trainer.devices=0"], "trainer.devices", "0", ">= 1 or -1"),
    (["trainer.num_nodes=0"], "trainer.num_nodes", "0", ">= 1"),
    (["trainer.strategy=fsdp"], "trainer.strategy", "'fsdp'", "ddp"),
    (["trainer.precision=8-bit"], "trainer.precision", "'8-bit'", "32-true"),
    (["trainer.collective_timeout_s=0"], "trainer.collective_timeout_s", "0.0", "> 0"),
    (["trainer.strategy=deepspeed_stage_2"], "trainer.accelerator", "'cpu'", "DeepSpeed"),
    (["trainer=deepspeed_stage_2"], "rl.grad_clip", "1.0", "DeepSpeed's global gradient_clipping"),
    (
        ["trainer=deepspeed_stage_2", "rl.grad_clip=0", "bids=relabelled"],
        "bids.relabel_rounds",
        "1",
        "bids=anchored",
    ),
    (
        ["trainer.gradient_clipping=1.0"],
        "trainer.gradient_clipping",
        "1.0",
        "deepspeed strategy only",
    ),
    (
        ["trainer=deepspeed_stage_3", "rl.grad_clip=0", "trainer.gradient_clipping=-1"],
        "trainer.gradient_clipping",
        "-1.0",
        ">= 0",
    ),
    (
        ["logger.tracking_uri=outputs/mlflow.db"],
        "logger.tracking_uri",
        "'outputs/mlflow.db'",
        "sqlite:///",
    ),
    (["logger.tracking_uri=http://"], "logger.tracking_uri", "'http://'", "http://127.0.0.1"),
    (["logger.name=wandb"], "logger.name", "'wandb'", "mlflow"),
    # sft
    (["sft.lr=-1"], "sft.lr", "-1.0", "> 0"),
    (["sft.epochs=0"], "sft.epochs", "0", ">= 1"),
    (["sft.batch_size=0"], "sft.batch_size", "0", ">= 1"),
    (["sft.demo_episodes=5000"], "sft.demo_episodes", "5000", "n_train_seeds"),
    (["sft.bid_fraction=0"], "sft.bid_fraction", "0.0", "(0, 1]"),
    (["sft.weight_decay=-0.1"], "sft.weight_decay", "-0.1", ">= 0"),
    (["model.sft_lr=nan"], "model.sft_lr", "nan", "finite"),
    # rl
    (["rl.cycles=-1"], "rl.cycles", "-1", ">= 0"),
    (["rl.lr=0"], "rl.lr", "0.0", "> 0"),
    (["rl.lr=inf"], "rl.lr", "inf", "finite"),
    (["rl.envs_per_update=0"], "rl.envs_per_update", "0", "n_train_seeds"),
    (["rl.action_updates=0", "rl.bid_updates=0"], "rl.action_updates", "0", ">= 1"),
    (["rl.grad_clip=-1"], "rl.grad_clip", "-1.0", ">= 0"),
    (["rl.fork_budget=-1"], "rl.fork_budget", "-1", ">= 0"),
    (["rl.max_bid_resamples=0"], "rl.max_bid_resamples", "0", ">= 1"),
    (["rl.bid_resample_temperature=0"], "rl.bid_resample_temperature", "0.0", "> 0"),
    (["rl.bt_beta=0"], "rl.bt_beta", "0.0", "> 0"),
    (["rl.control_forks=1.5"], "rl.control_forks", "1.5", "[0, 1]"),
    (["rl.fork_branches=0"], "rl.fork_branches", "0", ">= 1"),
    (["rl.bid_resample_samples=2"], "rl.bid_resample_samples", "2", ">= rl.max_bid_resamples"),
    (
        ["rl.bid_resample=below_runner_up", "rl.malformed_resample=bid_zero"],
        "rl.malformed_resample",
        "'bid_zero'",
        "needs rejection or sampled_below_runner_up",
    ),
    (["rl.bt_ties=keep"], "rl.bt_ties", "'keep'", "half_label"),
    (["rl.checkpoint_every=0"], "rl.checkpoint_every", "0", ">= 1"),
    (["rl.stop_after=0"], "rl.stop_after", "0", ">= 1"),
    (["rl.loss_normalization=max"], "rl.loss_normalization", "'max'", "token_mean"),
    (["rl.fork_steps=some"], "rl.fork_steps", "'some'", "until_last_reward"),
    (["rl.bid_resample=never"], "rl.bid_resample", "'never'", "rejection"),
    # eval
    (["eval.runs_per_seed=0"], "eval.runs_per_seed", "0", ">= 1"),
    (["eval.max_seeds=0"], "eval.max_seeds", "0", ">= 1"),
    (["eval.batch_size=0"], "eval.batch_size", "0", ">= 1"),
]


def compose_train(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_the_list_covers_every_group():
    assert len(INVALID) >= 30
    sections = {key.split(".")[0] for _, key, _, _ in INVALID}
    assert {"task", "model", "coordination", "credit", "trainer", "logger", "sft", "rl"} <= sections


def refusal(overrides: list[str]) -> str:
    """The message that refuses ``overrides``: from composition (a wrong type, or a choice
    the schema's enum lacks) or from :func:`validate`; fails the test when none does."""
    try:
        cfg = compose_train(overrides)
    except (ConfigCompositionException, OmegaConfBaseException) as error:
        return f"{error}\n{error.__cause__ or ''}"
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    return str(error.value)


@pytest.mark.parametrize(
    "overrides, key, value, allowed", INVALID, ids=[" ".join(case[0]) for case in INVALID]
)
def test_invalid_value_is_refused_naming_key_value_and_what_is_allowed(
    overrides, key, value, allowed
):
    message = refusal(overrides)
    lines = [line.strip() for line in message.splitlines()]
    named = [line for line in lines if line.startswith(f"{key}={value}:")]
    if named:  # bidswarm's own checks: one line per problem
        assert any(allowed in line for line in named), f"{allowed!r} not said in {named}"
    else:  # the schema's own type or enum check, at composition
        assert f"{key}=" in message and value.strip("'") in message, message
        assert allowed in message, f"{allowed!r} not said in {message}"


RULE_PARAMETERS = [
    (section, name, key, allowed.refuses)
    for section, registry in (("coordination", RULES), ("credit", CREDIT_RULES))
    for name, rule in sorted(registry.items())
    if not getattr(rule, "evaluation_only", False)  # training refuses those rules outright
    for key, allowed in rule.parameters()
]
"""Every declared parameter of every registered rule that can train, with a value its check
refuses."""


def test_training_refuses_an_evaluation_only_rule_naming_where_it_runs():
    message = refusal(["coordination=expert_owner"])
    assert "coordination='expert_owner'" in message and "bidswarm.evaluate" in message


@pytest.mark.parametrize(
    "section, name, key, refused",
    RULE_PARAMETERS,
    ids=[f"{s}={n} {s}.{k}={v!r}" for s, n, k, v in RULE_PARAMETERS],
)
def test_a_bad_value_of_any_rule_parameter_is_refused_naming_the_key(section, name, key, refused):
    cfg = compose_train([f"{section}={name}"])
    validate(cfg)  # the rule's YAML is fine as it is
    cfg[section][key] = refused
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert any(
        line.strip().startswith(f"{section}.{key}=") for line in str(error.value).splitlines()
    ), str(error.value)


def test_a_rule_name_whose_parameters_the_yaml_lacks_is_refused():
    message = refusal(["coordination=auction", "coordination.name=agentnet"])
    assert "coordination.name='agentnet'" in message and "coordination=agentnet" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("trainer", ["gpu", "deepspeed_stage_2", "multinode"])
def test_gpu_trainer_without_cuda_is_refused_by_the_machine_check(trainer):
    # DeepSpeed: no per-agent clip, no relabel rounds (the trainers' own command lines)
    cfg = compose_train([f"trainer={trainer}", "rl.grad_clip=0", "bids=anchored"])
    validate(cfg)  # the values are fine; this machine cannot run them
    with pytest.raises(ConfigError, match=r"trainer\.accelerator='gpu': no CUDA device"):
        check_machine(cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_vllm_block_size_its_cpu_backend_refuses_is_named_by_the_machine_check(monkeypatch):
    monkeypatch.setattr(machine, "vllm_python", lambda settings: sys.executable)
    cfg = compose_train(["model.engine=vllm", "model.vllm.block_size=48"])
    validate(cfg)  # a multiple of 16: a GPU takes it
    with pytest.raises(ConfigError, match=r"model\.vllm\.block_size=48: a multiple of 32 on a CPU"):
        check_machine(cfg)


def test_judge_key_variable_must_be_set(monkeypatch):
    monkeypatch.delenv("BIDSWARM_TEST_UNSET_KEY", raising=False)
    cfg = compose_train(
        [
            "task=research",
            "task.judge=llm",
            "task.judge_url=http://127.0.0.1:9/v1",
            "task.judge_model=m",
            "task.judge_api_key_env=BIDSWARM_TEST_UNSET_KEY",
        ]
    )
    validate(cfg)
    with pytest.raises(ConfigError, match=r"task\.judge_api_key_env='BIDSWARM_TEST_UNSET_KEY'"):
        check_machine(cfg)


def test_every_problem_is_listed_at_once():
    cfg = compose_train(["sft.lr=-1", "rl.cycles=-1", "model.tiny.hidden_size=63"])
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    for key in ("sft.lr", "rl.cycles", "model.tiny.hidden_size"):
        assert f"{key}=" in str(error.value)


@pytest.mark.parametrize(
    "arguments, named, option",
    [
        (["task=nonexistent"], "task=nonexistent", "crafting_iron_pickaxe"),
        (["-m", "model=tiny,huge"], "model=huge", "smollm2_135m"),
        (["debug=smok"], "debug=smok", "smoke"),
    ],
)
def test_unknown_option_lists_the_real_options_and_no_schema(arguments, named, option):
    with pytest.raises(ConfigError) as error:
        refuse_unknown_choices(arguments, CONF)
    message = str(error.value)
    assert message.startswith(named) and option in message
    assert "_schema" not in message


def test_known_options_and_other_overrides_pass():
    refuse_unknown_choices(
        ["-m", "task=crafting_torch,research", "debug=null", "rl.cycles=2", "seed=0,1"], CONF
    )


def test_cli_refuses_bad_values_fast_and_makes_no_folder(tmp_path):
    """The real CLI: the key, value and what is allowed; no run folder, no model, exit 1."""
    run_dir = tmp_path / "run"
    cases = {
        ("sft.lr=-1", "model.tiny.hidden_size=63"): [
            "sft.lr=-1.0: must be a finite number > 0",
            "model.tiny.hidden_size=63: must be a multiple of model.tiny.num_heads (4)",
        ],
        ("task=nonexistent",): ["task=nonexistent: no such option; choose one of"],
        ("coordination=agentnet", "coordination.keep_bid=2"): [
            "coordination.keep_bid=2.0: must lie in [0, 1]"
        ],
        ("credit=memory_tree", "credit.base=random"): [
            "credit.base='random': choose one of ['bucket_brigade', 'episode_return'"
        ],
        ("seed=-1",): ["seed=-1: must be an integer in 0 .. 4294967295"],
    }
    for overrides, expected in cases.items():
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bidswarm.train",
                "logger=csv",
                f"hydra.run.dir={run_dir}",
                *overrides,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        for line in expected:
            assert line in result.stderr, result.stderr
        assert "_schema" not in result.stderr
        assert not run_dir.exists(), "a refused config made its run folder"


def folder_refusals(tmp_path) -> list[tuple[str, str, str]]:
    """(key, folder, why the message gives): folders that cannot be made on this machine."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    cases = [("hydra.run.dir", f"{blocked}/run", f"{blocked} exists and is not a folder")]
    if Path("/proc/self").is_dir():  # Linux: /proc takes no folder ("no such file" from mkdir)
        cases.append(("hydra.run.dir", "/proc/x", "/proc exists but takes no new folder"))
    if Path("/sys/kernel").is_dir():
        cases.append(("hydra.sweep.dir", "/sys/x", "(/sys/x)"))
    return cases


def test_cli_names_an_output_folder_it_cannot_make_before_any_model_loads(tmp_path):
    """The real CLI: a run's (or sweep's) folder that cannot be made is named, with why, by
    the pre-run check; no traceback from Hydra's own mkdir."""
    for key, folder, why in folder_refusals(tmp_path):
        sweep = ["-m", "seed=0,1"] if key == "hydra.sweep.dir" else []
        result = subprocess.run(
            [sys.executable, "-m", "bidswarm.train", *sweep, "logger=csv", f"{key}={folder}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        said = f"Error: {key}={folder}: the output folder cannot be made: "
        assert said in result.stderr and why in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "SFT" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "override, meant",
    [
        ("rl.cycels=2", "rl.cycles"),
        ("task.max_decision=8", "task.max_decisions"),
        ("model.tiny.hiden_size=32", "model.tiny.hidden_size"),
        ("task.world_size.citys=4", "task.world_size.cities"),  # research's, any task chosen
        ("coordination.keep_bd=0.5", "coordination.keep_bid"),  # agentnet's
        ("sed=3", "seed"),
        ("rl.cycels=1,2", "rl.cycles"),  # a sweep's values
    ],
)
def test_a_misspelled_key_is_refused_with_the_key_it_meant(override, meant):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: no such key .* mean {meant}\?"):
        refuse_misspelled_keys(["-m", override] if "," in override else [override])


@pytest.mark.parametrize(
    "arguments",
    [
        ["rl.cycles=2", "task=navigation_r2r", "task.door_width=1.2", "debug=reward", "seed=1"],
        ["+rl.cycels=2"],  # an added key: validate refuses it, with the same suggestion
        ["rl.zzz=1"],  # no key is close: Hydra's own refusal names it
        ["hydra.run.dir=out", "hydra/launcher=local", "~logger.tracking_uri"],
    ],
)
def test_known_added_and_far_keys_are_left_to_hydra(arguments):
    refuse_misspelled_keys(arguments)


def test_an_added_misspelled_key_is_refused_by_validate_with_the_key_it_meant():
    cfg = compose_train(["+rl.cycels=2"])
    with pytest.raises(ConfigError, match=r"rl\.cycels: not a field .*; did you mean rl\.cycles\?"):
        validate(cfg)


def leaf_keys(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


@pytest.mark.parametrize("group", ["task", "coordination", "credit", "model", "trainer", "logger"])
def test_no_key_of_any_option_is_taken_for_a_misspelling(group):
    for path in sorted((CONF / group).glob("*.yaml")):
        cfg = compose_train([f"{group}={path.stem}"])
        keys = list(leaf_keys(OmegaConf.to_container(cfg, resolve=False)))
        refuse_misspelled_keys([f"{key}=1" for key in keys])  # raises on a false alarm


def test_cli_suggests_the_key_a_misspelled_one_meant_and_makes_no_folder(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "bidswarm.train", f"hydra.run.dir={run_dir}", "rl.cycels=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rl.cycels: no such key in the config; did you mean rl.cycles?" in result.stderr
    assert not run_dir.exists()
