"""Recipe validation: exact error messages naming the field path, the value and the fix."""

from __future__ import annotations

import pytest

from evotrainer.recipe import (
    Recipe,
    RecipeError,
    apply_value_rule,
    diff_recipes,
    field_bounds,
    get_path,
    load_recipe,
    set_path,
    validate_recipe,
)


def test_defaults_follow_the_evotrainer_recipe():
    r = Recipe()
    assert r.advantage_estimator == "group_norm"
    assert (r.eps_clip_low, r.eps_clip_high) == (0.2, 0.28)
    assert r.kl_estimator == "k3" and r.init_kl_coef == 1e-3 and r.kl_enabled
    assert r.loss_agg_mode == "token-mean"
    assert list(r.reward) == ["correctness"]


def test_group_size_error_names_field_value_and_fix():
    with pytest.raises(RecipeError) as e:
        validate_recipe({"n_samples_per_prompt": 1})
    assert str(e.value) == (
        "recipe.n_samples_per_prompt=1: group-relative advantages need at least 2 samples per prompt; set 2 or more"
    )


def test_unknown_key_lists_allowed_fields():
    with pytest.raises(RecipeError) as e:
        validate_recipe({"lora": {"r": 8}})
    msg = str(e.value)
    assert msg.startswith("recipe.lora: unknown field; allowed: name, seed, model, advantage_estimator,")


def test_nested_unknown_key_and_literal():
    with pytest.raises(RecipeError) as e:
        validate_recipe({"model": {"lora": {"rank": 8}}, "kl_estimator": "k4"})
    lines = str(e.value).splitlines()
    assert "recipe.model.lora.rank: unknown field; allowed: enabled, r, alpha, dropout, target_modules" in lines
    assert "recipe.kl_estimator='k4': not allowed; allowed values: 'k1', 'k2' or 'k3'" in lines


def test_unknown_reward_component():
    with pytest.raises(RecipeError) as e:
        validate_recipe({"reward": {"bogus": {"weight": 1}}})
    assert str(e.value).startswith("recipe.reward={'bogus': {'weight': 1}}: unknown reward component 'bogus'; allowed: correctness,")


def test_band_and_range_rules():
    with pytest.raises(RecipeError, match=r"^recipe.data.difficulty_band=\[0.9, 0.1\]: need 0 <= low <= high <= 1, e.g. \[0.1, 0.9\]$"):
        validate_recipe({"data": {"difficulty_band": [0.9, 0.1]}})
    with pytest.raises(RecipeError, match=r"need low < high"):
        validate_recipe({"dynamic_filtering_range": [0.5, 0.5]})


def test_paths_get_set_diff():
    r = Recipe()
    assert get_path(r, "data.level") == 1
    r2 = set_path(r, "data.level", 2)
    assert diff_recipes(r, r2) == [("data.level", 1, 2)]
    r3 = set_path(r, "reward.format.weight", 0.1)
    assert diff_recipes(r, r3) == [("reward.format.weight", None, 0.1)]
    with pytest.raises(RecipeError, match=r"recipe.data.nope: no such field path"):
        set_path(r, "data.nope", 1)


def test_unknown_path_names_the_fix():
    # a wrong path said only "no such field path": now the closest field, or the fields the section has
    r = Recipe()
    with pytest.raises(RecipeError) as e:
        get_path(r, "actor_learning_rat")
    assert str(e.value) == "recipe.actor_learning_rat: no such field path; did you mean 'actor_learning_rate'?"
    with pytest.raises(RecipeError) as e:
        set_path(r, "model.lora.rr", 8)
    assert str(e.value) == "recipe.model.lora.rr: no such field path; did you mean 'model.lora.r'?"
    with pytest.raises(RecipeError) as e:
        set_path(r, "data.nope", 1)
    assert str(e.value) == ("recipe.data.nope: no such field path; recipe.data has: dedupe, difficulty_band, level, "
                            "n_heldout, n_test, n_train, path, prompt_suffix, seed, system_prompt, task")
    with pytest.raises(RecipeError) as e:
        get_path(r, "eps_clip_high.low")
    assert str(e.value) == "recipe.eps_clip_high.low: no such field path; eps_clip_high is not a section"
    with pytest.raises(RecipeError, match=r"recipe.temperature=-1.0: Input should be greater than 0"):
        set_path(r, "temperature", -1.0)


def test_load_recipe_yaml(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("recipe:\n  n_samples_per_prompt: 4\n  data: {task: arithmetic, level: 2}\n")
    r = load_recipe(p)
    assert r.n_samples_per_prompt == 4 and r.data.level == 2
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "missing.yaml")


# --- value rules (evotrainer.recipe.apply_value_rule: the one home of x / + steps and their rounding) --------
def test_value_rule_keeps_a_tiny_learning_rate():
    # a fixed number of decimals (round(x, 10)) turned 1e-10 x 0.1 into 0 and the candidate was dropped
    assert apply_value_rule({"op": "mul", "by": 0.1}, 1e-10, "actor_learning_rate") == 1e-11
    assert apply_value_rule({"op": "mul", "by": 0.1}, 1e-11, "actor_learning_rate") == 1e-12
    assert apply_value_rule({"op": "mul", "by": 0.5}, 1e-6) == 5e-7  # 12 significant digits, not 4.99...e-07
    child = set_path(Recipe(), "actor_learning_rate", apply_value_rule({"op": "mul", "by": 0.1}, 1e-10))
    assert child.actor_learning_rate == 1e-11  # a valid recipe value (gt=0)


def test_value_rule_keeps_integer_fields_integers_within_their_bounds():
    n = apply_value_rule({"op": "mul", "by": 2, "max": 64}, 8, "n_samples_per_prompt")
    assert n == 16 and isinstance(n, int)
    gml = apply_value_rule({"op": "mul", "by": 0.5}, 75, "generate_max_len")
    assert gml == 38 and isinstance(gml, int)  # 37.5 rounds half to even
    assert field_bounds("generate_max_len") == (1, 131_072) and field_bounds("data.level") == (1, 6)
    assert apply_value_rule({"op": "mul", "by": 0.5}, 1, "generate_max_len") == 1  # 0.5 -> the field's minimum 1
    assert apply_value_rule({"op": "add", "by": 1}, 6, "data.level") == 6  # the field's maximum
    assert apply_value_rule({"op": "add", "by": 2, "max": 8}, 7, "max_refill_rounds") == 8  # the rule's own max
    with pytest.raises(RecipeError, match="needs a number"):
        apply_value_rule({"op": "mul", "by": 2}, None, "reward.format.weight")
    with pytest.raises(RecipeError, match="allowed ops"):
        apply_value_rule({"op": "pow", "by": 2}, 1.0)


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("actor_learning_rate: .inf", "recipe.actor_learning_rate=inf: not a finite number; set a finite number "
                                  "(not .nan or .inf)"),
    ("reward: {format: {weight: .nan}}", "recipe.reward.format.weight=nan: not a finite number; set a finite number "
                                         "(not .nan or .inf)"),
    ("eval: {temperature: .inf}", "recipe.eval.temperature=inf: not a finite number; set a finite number "
                                  "(not .nan or .inf)"),
    ("data: {difficulty_band: [0.0, .nan]}", "recipe.data.difficulty_band.1=nan: not a finite number; set a finite "
                                             "number (not .nan or .inf)"),
    ("reward: {overlong: {params: {penalty_factor: .inf}}}", "recipe.reward.overlong.params.penalty_factor=inf: need "
                                                             "a finite number (not .nan or .inf), e.g. "
                                                             "penalty_factor: 0.5"),
    ("name: !!binary cg==", "recipe.name=b'r': not a string (bytes); write it as plain text"),
    ("data: {system_prompt: !!binary cg==}", "recipe.data.system_prompt=b'r': not a string (bytes); write it as "
                                             "plain text"),
])
def test_non_finite_numbers_and_binary_text_are_refused_naming_the_field(tmp_path, yaml_text, error):
    """Review 10, Z-R10: through `init --recipe`, `actor_learning_rate: .inf` was accepted (stored as `Infinity`,
    MCP `get_version` showed null), `reward.format.weight: .nan` too, and `name: !!binary` was decoded to text."""
    p = tmp_path / "r.yaml"
    p.write_text(f"name: r\n{yaml_text}\n" if not yaml_text.startswith("name") else yaml_text + "\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == error


@pytest.mark.parametrize(("rule", "error"), [
    ({"op": "mul", "by": float("inf")}, "value rule by=inf: need a finite number (not .nan or .inf), e.g. "
                                        "{op: mul, by: 2}"),
    ({"op": "add", "by": 1, "max": float("nan")}, "value rule max=nan: need a finite number (not .nan or .inf), e.g. "
                                                  "{op: add, max: 2}"),
    ({"op": "mul", "by": None}, "value rule op='mul' needs 'by', e.g. {op: mul, by: 2}"),
])
def test_value_rule_numbers_are_finite(rule, error):
    """Review 10, K-R10: `check_value_rule` took `by: null / inf / nan`; applying it was a bare TypeError."""
    with pytest.raises(RecipeError) as e:
        apply_value_rule(rule, 1.0, "temperature")
    assert str(e.value) == error


@pytest.mark.parametrize(("yaml_text", "error"), [
    # review 20 (Y1-R20): without Python's set_int_max_str_digits() advice, with the line
    ("seed: " + "9" * 5000, "{p}: an integer of 5,000 digits at line 2, past the 64 a YAML integer may have here (a "
                            "seed, step or count has at most 20); write it as a quoted string, or fix the value"),
    ("seed: 0x" + "f" * 5000, "recipe.seed=an integer of 20,000 bits: Input should be less than 9223372036854775808; "
                              "set a value < 9223372036854775808"),
    ("seed: 0x1000000000000000000", "recipe.seed=4722366482869645213696: Input should be less than "
                                    "9223372036854775808; set a value < 9223372036854775808"),
    ("data: {seed: -1}", "recipe.data.seed=-1: Input should be greater than or equal to 0; set a value >= 0"),
])
def test_huge_integers_in_a_recipe_file_are_refused_naming_the_file_or_the_field(tmp_path, yaml_text, error):
    """Review 14 G-R14: a 5,000-digit seed ended every command with Python's bare "Exceeds the limit (4300 digits)"
    naming no file; a 20,000-bit hex seed was a valid recipe, and a seed of 2**72 made a run whose every training
    ended with "Overflow when unpacking long long". Seeds lie in [0, 2**63); an integer YAML cannot read names the
    file."""
    p = tmp_path / "r.yaml"
    p.write_text(f"name: r\n{yaml_text}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == error.format(p=p)


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("eval: {k: 1180591620717411303424}", "recipe.eval.k=1180591620717411303424: Input should be less than or equal "
                                          "to 1024; set a value <= 1024"),
    ("generate_max_len: 1180591620717411303424", "recipe.generate_max_len=1180591620717411303424: Input should be less "
                                                 "than or equal to 131072; set a value <= 131072"),
    ("n_samples_per_prompt: 5000", "recipe.n_samples_per_prompt=5000: Input should be less than or equal to 1024; "
                                   "set a value <= 1024"),
])
def test_every_integer_field_of_a_recipe_has_a_finite_bound(tmp_path, yaml_text, error):
    """Review 15 G-R15: 2**70 in eval.k made a valid recipe whose evaluation ended in "Overflow when unpacking long
    long"; generate_max_len = 2**70 a 1-step training still running at 48 s and 1.45 GB. Every integer field now has
    a finite bound, named in the error."""
    p = tmp_path / "r.yaml"
    p.write_text(f"name: r\n{yaml_text}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == error


def test_a_config_file_past_the_yaml_size_cap_is_refused_before_it_is_parsed(tmp_path):
    """Review 15 Y-R15: a 1 MiB YAML list took 12-24 s and ~440 MB in `recipe validate` and `skills add` before its
    error. A config or skills file past YAML_MAX_BYTES (256 KiB) is refused by its size, naming it."""
    import time

    from evotrainer.recipe import YAML_MAX_BYTES

    p = tmp_path / "big.yaml"
    p.write_text("- 1\n" * 300_000)  # 1.2 MB
    t = time.monotonic()
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert time.monotonic() - t < 1
    assert str(e.value) == (f"{p}: 1,200,000 bytes, past the {YAML_MAX_BYTES:,} a recipe file may have (YAML reads at "
                            "~50 KB/s in Python); a config is a few KB: cut it down")


def _float_fields(model, prefix=""):
    """Dotted paths of every float field (a float, an optional float or a tuple of floats) under ``model``, with
    the field; a ``dict[str, Section]`` (the reward) is walked through one key (``correctness``)."""
    import typing

    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out += _float_fields(ann, f"{path}.")
        elif typing.get_origin(ann) is dict and hasattr(args[-1], "model_fields"):
            out += _float_fields(args[-1], f"{path}.correctness.")
        elif ann is float or float in args:
            out.append((path, info))
    return out


def _yaml_at(path, value):
    """A run-config YAML text that sets the dotted ``path`` to the YAML ``value`` text."""
    *parents, leaf = path.split(".")
    text = f"{leaf}: {value}"
    for p in reversed(parents):
        text = f"{p}: {{{text}}}"
    return text + "\n"


def test_every_float_field_of_a_recipe_or_run_config_has_a_finite_bound(tmp_path):
    """Review 16 G-R16: inf and 1e308 were valid in every float field without an upper bound (a tool timeout of
    1e308 s overflows threading's wait, a temperature of 1e30 turns sampling to noise, wall_clock_minutes: .inf was
    accepted). Every float field of RunConfig / Budget / Recipe and its sections now has a finite upper bound and
    refuses 1e300, .inf and .nan naming the field."""
    from evotrainer.config import RunConfig, load_run_config

    fields = _float_fields(RunConfig)
    paths = [p for p, _ in fields]
    # the list is the whole set: a new float field is checked here too
    assert paths == [
        "budget.wall_clock_minutes", "budget.exploit_fraction", "recipe.model.lora.dropout",
        "recipe.eps_clip_low", "recipe.eps_clip_high", "recipe.init_kl_coef", "recipe.actor_learning_rate",
        "recipe.lr_warmup_ratio", "recipe.l2", "recipe.max_norm", "recipe.temperature", "recipe.top_p",
        "recipe.dynamic_filtering_range", "recipe.group_filter_top_p", "recipe.reward.correctness.weight",
        "recipe.data.difficulty_band", "recipe.tool_use.per_call_timeout_s", "recipe.tool_use.per_episode_timeout_s",
        "recipe.eval.temperature"]
    p = tmp_path / "c.yaml"
    for path, info in fields:
        tuple_field = "range" in path or "band" in path
        if not tuple_field:  # a scalar: its bound is a pydantic le / lt
            assert any(getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None
                       for m in info.metadata), path
        for value in ("1e300", ".inf", ".nan", "-.inf"):
            p.write_text(_yaml_at(path, f"[0.0, {value}]" if tuple_field else value))
            with pytest.raises(RecipeError) as e:
                load_run_config(p)
            assert str(e.value).startswith(f"config.{path}"), (path, value, str(e.value))
    # the bounds the review asked for
    lines = {
        "recipe.tool_use.per_call_timeout_s": ("86401", "set a value <= 86400"),
        "recipe.tool_use.per_episode_timeout_s": ("1e308", "set a value <= 86400"),
        "recipe.temperature": ("1e30", "set a value <= 10"),
        "recipe.eval.temperature": ("10.5", "set a value <= 10"),
        "recipe.actor_learning_rate": ("2", "set a value <= 1"),
        "recipe.eps_clip_high": ("11", "set a value <= 10"),
        "recipe.init_kl_coef": ("101", "set a value <= 100"),
        "recipe.l2": ("11", "set a value <= 10"),
        "recipe.max_norm": ("2e6", "set a value <= 1000000"),
        "recipe.reward.correctness.weight": ("-1001", "set a value >= -1000"),
        "budget.wall_clock_minutes": ("525601", "set a value <= 525600"),
        "branch_threads": ("1025", "set a value <= 1024"),
    }
    for path, (value, fix) in lines.items():
        p.write_text(_yaml_at(path, value))
        with pytest.raises(RecipeError) as e:
            load_run_config(p)
        assert str(e.value).startswith(f"config.{path}=") and str(e.value).endswith(fix), str(e.value)
    p.write_text(_yaml_at("budget.wall_clock_minutes", ".inf"))
    with pytest.raises(RecipeError) as e:
        load_run_config(p)
    assert str(e.value) == ("config.budget.wall_clock_minutes=inf: not a finite number; set a finite number "
                            "(not .nan or .inf)")
    # the largest allowed values are still valid
    cfg = RunConfig.model_validate({"branch_threads": 1024, "budget": {"wall_clock_minutes": 525_600},
                                    "recipe": {"temperature": 10, "tool_use": {"per_call_timeout_s": 86_400}}})
    assert cfg.recipe.temperature == 10 and cfg.budget.wall_clock_minutes == 525_600


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("reward: {overlong: {params: {penalty_factor: 1.0e+300}}}",
     "recipe.reward.overlong.params.penalty_factor=1e+300: need a value in [0, 1000]"),
    ("reward: {length_penalty: {params: {per_token: 1001}}}",
     "recipe.reward.length_penalty.params.per_token=1001: need a value in [0, 1000]"),
    ("dynamic_filtering_range: [-1.0e+308, 1.0e+308]",
     "recipe.dynamic_filtering_range=[-1e+308, 1e+308]: need -11000 <= low < high <= 11000 (a mean reward), "
     "e.g. [0.0, 1.0]"),
])
def test_float_reward_params_and_the_filtering_range_are_bounded(tmp_path, yaml_text, error):
    """Review 16 G-R16: a reward's float params and dynamic_filtering_range took any finite float (1e300)."""
    p = tmp_path / "r.yaml"
    p.write_text(f"name: r\n{yaml_text}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == error
