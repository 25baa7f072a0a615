"""Every option of every config group composes; bad keys and values fail before models load."""

from __future__ import annotations

import re
from datetime import datetime

import lightning  # noqa: F401  (sets its process-wide variables before the leak guard runs)
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from bidswarm.config import (
    BidSlotWithoutBids,
    ModelConfig,
    RLConfig,
    SFTConfig,
    SFTMatch,
    TrainConfig,
    register_configs,
    validate,
)
from conftest import CONF

register_configs()

GROUPS = [
    "task",
    "model",
    "coordination",
    "credit",
    "trainer",
    "logger",
    "ablation",
    "experiment",
    "debug",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=False)


@pytest.mark.parametrize(
    "override", [f"{g}={o}" for g in GROUPS for o in options(g)], ids=lambda s: s
)
def test_every_option_composes_and_validates(override):
    group, option = override.split("=")
    text = (CONF / group / f"{option}.yaml").read_text()
    if "python -m bidswarm.evaluate" in text:  # evaluation diffs compose with evaluate.yaml
        from bidswarm.evaluate import register_evaluate_config

        register_evaluate_config()
        with initialize_config_dir(str(CONF), version_base="1.3"):
            compose("evaluate", overrides=[override, "run_dir=somewhere"])
        if "python -m bidswarm.train" not in text:
            return
    # A DeepSpeed trainer clips one global norm and refuses the per-agent clip and the bid
    # channel's relabel rounds (its YAML's command line says rl.grad_clip=0 bids=anchored;
    # test_config_errors.py refuses them without).
    said = ["rl.grad_clip=0"] if "rl.grad_clip=0" in text else []
    said += ["bids=anchored"] if "bids=anchored" in text.splitlines()[1] else []
    cfg = compose_train([override, *said])
    validate(cfg)
    assert cfg.task.name and cfg.model.name and cfg.coordination.name


def test_default_config_is_the_paper_setting():
    """The paper's method settings; the task is the CPU-sized main job (README says why)."""
    cfg = compose_train([])
    assert cfg.task.name == "crafting" and cfg.task.target == "wooden_pickaxe"
    assert compose_train(["task=crafting_iron_pickaxe"]).task.max_decisions == 120
    assert list(cfg.coordination.bid_levels) == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert (cfg.rl.action_updates, cfg.rl.bid_updates, cfg.rl.max_bid_resamples) == (4, 1, 3)
    assert cfg.credit.name == "bucket_brigade"
    assert cfg.sft.lr == cfg.model.sft_lr and cfg.rl.lr == cfg.model.rl_lr


def test_train_yaml_writes_no_schema_default():
    """One home per default: the schema. ``train.yaml``'s root keys and sections link the
    model's values (``${model.sft_lr}``) and write nothing the schema already says; the
    sections' links have no default of their own either (``SFTConfig.lr`` is the model's)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"))
    raw.pop("defaults"), raw.pop("hydra")
    schema = OmegaConf.structured(TrainConfig)
    restated = [
        f"{key}={value!r}" for key, value in leaves(raw) if OmegaConf.select(schema, key) == value
    ]
    assert not restated, f"train.yaml restates the schema's defaults: {restated}"
    model = ModelConfig()
    assert (SFTConfig().lr, SFTConfig().epochs, RLConfig().lr) == (
        model.sft_lr,
        model.sft_epochs,
        model.rl_lr,
    )


SCHEMA_GROUPS = ["task", "model", "coordination", "credit", "trainer", "logger"]
"""The component groups: each option starts from its group's schema (``<name>_schema``)."""


def leaves(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``(dotted key, value)`` of every leaf of a plain nested dict."""
    found = []
    for key, value in node.items():
        if isinstance(value, dict) and value:
            found += leaves(value, f"{prefix}{key}.")
        else:
            found.append((f"{prefix}{key}", value))
    return found


@pytest.mark.parametrize(
    "path",
    [path for group in SCHEMA_GROUPS for path in sorted((CONF / group).glob("*.yaml"))],
    ids=lambda path: f"{path.parent.name}/{path.stem}",
)
def test_a_group_option_writes_only_what_differs_from_its_schema(path):
    """One home per default: the schema. An option's YAML names the option and the values in
    which it differs; a value equal to the schema's default would be a second home that could
    drift from it."""
    from hydra.core.config_store import ConfigStore

    raw = OmegaConf.to_container(OmegaConf.load(path))
    schemas = [d for d in raw.pop("defaults") if isinstance(d, str) and d.endswith("_schema")]
    assert len(schemas) == 1, f"{path.name}: its defaults name no schema"
    schema = ConfigStore.instance().load(f"{path.parent.name}/{schemas[0]}.yaml").node
    restated = []
    for key, value in leaves(raw):
        if OmegaConf.is_missing(schema, key.split(".")[0]):
            continue  # a required choice (``name`` of a rule): the option must write it
        default = OmegaConf.select(schema, key)
        if OmegaConf.is_config(default):
            default = OmegaConf.to_container(default)
        if default == value:
            restated.append(f"{path.parent.name}.{key}={value!r}")
    assert not restated, f"{path.name} restates the schema's defaults: {restated}"


def test_the_budget_rules_default_to_matched_passes_and_action_updates():
    cfg = compose_train([])
    assert (cfg.sft.match, cfg.rl.bid_slot_without_bids) == ("action_passes", "skip")
    assert SFTConfig().match == SFTMatch.action_passes
    assert RLConfig().bid_slot_without_bids == BidSlotWithoutBids.skip


def test_the_long_horizon_options_default_to_the_paper():
    """Every option for long horizons is off by default: the paper's method, the canary's."""
    rl = compose_train([]).rl
    assert (rl.kl_coef, rl.entropy_coef, rl.baseline, rl.normalize_advantage) == (
        0.0,
        0.0,
        "agent_mean",
        False,
    )
    assert (rl.lr_schedule, rl.warmup_updates, rl.fork_selection) == ("constant", 0, "uniform")
    assert compose_train(["credit=discounted_return"]).credit.gamma == 0.95


@pytest.mark.parametrize(
    "override", ["sft.match=tokens", "rl.bid_slot_without_bids=action"], ids=lambda s: s
)
def test_the_old_budget_rules_stay_selectable(override):
    key, value = override.split("=")
    section, name = key.split(".")
    assert compose_train([override])[section][name] == value


@pytest.mark.parametrize(
    "override, key",
    [("rl.fork_budgt=3", "fork_budgt"), ("task.targte=torch", "targte")],
)
def test_misspelled_key_fails_naming_it(override, key):
    with pytest.raises((ConfigCompositionException, ConfigKeyError)) as error:
        compose_train([override])
    assert key in str(error.value) or key in str(error.value.__cause__)


@pytest.mark.parametrize("override, key", [("+model.hidden=3", "model.hidden"), ("+sed=1", "sed")])
def test_added_key_outside_the_schema_fails_validation(override, key):
    cfg = compose_train([override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_wrong_type_fails_naming_the_key():
    with pytest.raises((ConfigCompositionException, ValidationError)) as error:
        compose_train(["rl.cycles=many"])
    assert "cycles" in str(error.value) + str(error.value.__cause__)


@pytest.mark.parametrize(
    "override, key",
    [
        ("coordination.bid_levels=[0,0.5,1.2]", "coordination.bid_levels"),
        ("coordination.replicas=0", "coordination.replicas"),
        ("task.name=chess", "task.name"),
        ("credit.name=magic", "credit.name"),
        ("rl.envs_per_update=0", "rl.envs_per_update"),
        ("sft.bid_fraction=0", "sft.bid_fraction"),
        ("rl.kl_coef=-0.1", "rl.kl_coef"),
        ("rl.entropy_coef=-1", "rl.entropy_coef"),
        ("rl.warmup_updates=-1", "rl.warmup_updates"),
        ("credit=discounted_return credit.gamma=1.5", "credit.gamma"),
    ],
)
def test_invalid_value_fails_before_any_model_loads(override, key):
    cfg = compose_train(override.split())
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate(cfg)


@pytest.mark.parametrize(
    "override, key",
    [
        ("rl.loss_normalization=max", "rl.loss_normalization"),
        ("rl.fork_steps=sometimes", "rl.fork_steps"),
        ("rl.bid_resample=never", "rl.bid_resample"),
        ("model.source=magic", "model.source"),
        ("model.dtype=int8", "model.dtype"),
        ("model.prompt_style=verbose", "model.prompt_style"),
        ("sft.match=flops", "sft.match"),
        ("rl.bid_slot_without_bids=bid", "rl.bid_slot_without_bids"),
        ("rl.baseline=median", "rl.baseline"),
        ("rl.lr_schedule=step", "rl.lr_schedule"),
        ("rl.fork_selection=best", "rl.fork_selection"),
    ],
)
def test_a_value_outside_a_fixed_set_fails_at_composition_naming_the_key(override, key):
    """Fixed value sets are enums of the schema: checked once, when the config is composed."""
    with pytest.raises((ConfigCompositionException, ValidationError)) as error:
        compose_train([override])
    message = f"{error.value}\n{error.value.__cause__}"
    assert key in message and "expected one of" in message


def test_the_smoke_profile_is_sized_per_model():
    tiny = compose_train(["debug=smoke"])
    smol = compose_train(["debug=smoke", "model=smollm2_135m"])
    validate(smol)
    assert tiny.sft.demo_episodes == 6 and smol.sft.demo_episodes < tiny.sft.demo_episodes
    assert smol.rl.micro_batch_tokens == smol.model.micro_batch_tokens < tiny.rl.micro_batch_tokens
    assert compose_train(["debug=smoke", "model=smollm2_135m", "sft.epochs=3"]).sft.epochs == 3


@pytest.mark.parametrize(
    "overrides, budget",
    [
        (["debug=smoke"], 24),  # conf/debug/task/smoke_crafting_wooden_pickaxe.yaml
        (["debug=reward"], 30),  # the wooden pickaxe's own (the canary's run)
        (["debug=smoke", "task=navigation_r2r"], 24),
        (["debug=reward", "task=navigation_r2r"], 12),
        (["debug=smoke", "task=research"], 24),  # research's own
        (["debug=reward", "task=research"], 12),
        (["debug=smoke", "model=smollm2_135m"], 8),  # the model's profile wins over the task's
        (["debug=smoke", "model=smollm2_135m", "task=navigation_r2r"], 8),
        (["debug=smoke", "task=crafting_iron_pickaxe"], 120),  # no task profile: its own
        (["debug=reward", "task=crafting_iron_pickaxe"], 120),
        (["debug=reward", "task=navigation_r2r", "task.max_decisions=7"], 7),
    ],
    ids=lambda value: value if isinstance(value, int) else " ".join(value),
)
def test_a_debug_profile_keeps_the_tasks_budget_unless_a_task_or_model_profile_sets_it(
    overrides, budget
):
    assert compose_train(overrides).task.max_decisions == budget


@pytest.mark.parametrize(
    "overrides, said",
    [
        (
            ["debug=reward", "task=navigation_r2r"],
            "debug=reward changes the task's own values: task.max_decisions 64 -> 12, ",
        ),
        (["debug=smoke"], "debug=smoke changes the task's own values: task.max_decisions 30 -> 24"),
        (
            ["debug=reward"],
            "debug=reward changes the task's own values: task.n_heldout_seeds 32 -> 4",
        ),
    ],
)
def test_a_debug_profile_says_what_it_changes_of_the_task(overrides, said, capsys):
    from bidswarm.run.preflight import say_debug_changes

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
        say_debug_changes(cfg.hydra, cfg)
        out = capsys.readouterr().out
        assert f"[bidswarm] {said}" in out
        assert ("max_decisions" in out) == ("max_decisions" in said)  # reward keeps the 30
        plain = compose("train", overrides=["task=navigation_r2r"], return_hydra_config=True)
        say_debug_changes(plain.hydra, plain)
        assert capsys.readouterr().out == ""


def test_trainer_deterministic_reaches_the_trainer(tmp_path):
    from types import SimpleNamespace

    from bidswarm.run.phases import Run

    cfg = compose_train(["trainer.deterministic=true"])
    run = SimpleNamespace(cfg=cfg, logger=None, run_dir=tmp_path)
    assert Run.trainer_kwargs(run)["deterministic"] is True


@pytest.mark.parametrize("entry", ["train", "evaluate"])
@pytest.mark.parametrize("folder", ["run", "sweep"])
def test_runs_started_in_the_same_second_get_their_own_folder(entry, folder):
    """Two runs or sweeps launched together (lanes of a script) must not share Hydra's output
    folder: the folder's time stamp tells apart two launches a millisecond apart."""
    hydra = OmegaConf.to_container(OmegaConf.load(CONF / f"{entry}.yaml").hydra, resolve=False)
    pattern = hydra[folder]["dir"]
    stamps = re.findall(r"\$\{now:([^}]*)\}", pattern)
    assert stamps, pattern
    first, second = datetime(2026, 12, 4, 18, 46, 57, 1000), datetime(2026, 12, 4, 18, 46, 57, 2000)
    assert [first.strftime(s) for s in stamps] != [second.strftime(s) for s in stamps], pattern
