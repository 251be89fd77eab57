"""OpenRLHF backend on CPU: commands checked by OpenRLHF's own parsers, the reward file, runner, ingest.

Parsers: 0.11.2 (the pinned version; its installed source, or its wheel) and the previous minor
0.10.x in both spellings it shipped: 0.10.4 (dotted, like 0.11) and 0.10.1 (flat, before the 0.10.2
rename). Wheels are fetched with ``pip download --no-deps`` into the pytest cache (PyPI is reachable
in CI); without network those cases skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from evotrainer.recipe import Recipe, set_path
from evotrainer.rl_backend.openrlhf.job import (
    FLAGS,
    ClusterSpec,
    OpenRLHFError,
    build_job,
    flag_scheme,
    format_job,
    installed_openrlhf_version,
)
from evotrainer.rl_backend.openrlhf.runner import (
    cancel_job,
    check_job,
    job_logs,
    job_status,
    load_parser,
    submit,
)

DATA = Path(__file__).parent / "data"
VERSIONS = ["0.11.2", "0.10.4", "0.10.1"]


@pytest.fixture(scope="session")
def parser_source(request):
    """``version -> path of openrlhf/cli/train_ppo_ray.py`` of that release (utils/config.py beside it)."""
    cache = Path(request.config.cache.mkdir("openrlhf-wheels"))

    def get(version: str) -> Path:
        if installed_openrlhf_version() == version:
            spec = importlib.util.find_spec("openrlhf")
            return Path(list(spec.submodule_search_locations)[0]) / "cli" / "train_ppo_ray.py"
        root = cache / version
        target = next(root.rglob("cli/train_ppo_ray.py"), None) if root.exists() else None
        if target is None:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"openrlhf=={version}",
                                "-d", str(cache)], capture_output=True, text=True, timeout=300)
            wheels = sorted(cache.glob(f"openrlhf-{version}-*.whl"))
            if r.returncode != 0 or not wheels:
                pytest.skip(f"cannot download openrlhf=={version} (no network?): {r.stderr.strip()[-200:]}")
            with zipfile.ZipFile(wheels[0]) as z:
                for n in z.namelist():
                    if n.endswith(("cli/train_ppo_ray.py", "utils/config.py")):
                        z.extract(n, root)
            target = next(root.rglob("cli/train_ppo_ray.py"))
        return target

    return get


def _job(tmp_path, version, recipe=None, steps=3, **cluster):
    return build_job(recipe or Recipe(), tmp_path, version_id="v1", steps=steps,
                     cluster=ClusterSpec(openrlhf_version=version, **cluster))


def _get(args, scheme, dotted, flat):
    node = args
    for part in (dotted if scheme == "dotted" else flat).split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("version", VERSIONS)
def test_default_recipe_parses_and_passes_openrlhf_checks(tmp_path, parser_source, version):
    job = _job(tmp_path, version)
    assert job.scheme == ("flat" if version == "0.10.1" else "dotted")
    args = check_job(job, parser_source(version))
    s = job.scheme
    assert _get(args, s, "rollout.n_samples_per_prompt", "n_samples_per_prompt") == 8
    assert list(_get(args, s, "actor.eps_clip_low_high", "eps_clip_low_high")) == [0.2, 0.28]
    assert _get(args, s, "algo.kl.init_coef", "init_kl_coef") == 1e-3
    assert _get(args, s, "algo.kl.estimator", "kl_estimator") == "k3"
    assert _get(args, s, "algo.kl.use_loss", "use_kl_loss") is True
    assert _get(args, s, "algo.advantage.estimator", "advantage_estimator") == "group_norm"
    assert _get(args, s, "algo.dynamic_filtering_enable", "dynamic_filtering") is True  # drop_zero_variance_groups
    assert _get(args, s, "reward.remote_url", "remote_rm_url") == [job.files["reward"]]  # split on "," by OpenRLHF
    assert _get(args, s, "train.batch_size", "train_batch_size") == 32  # 4 prompts x 8 samples: 1 update per step
    assert _get(args, s, "data.max_len", "max_len") == 512 + 64
    assert _get(args, s, "logger.tensorboard_dir", "use_tensorboard").endswith("tensorboard")
    # 3 steps x 4 prompts per step = 12 prompt rows; every file the command names exists in the job dir
    assert len((Path(job.job_dir) / "train.jsonl").read_text().splitlines()) == 12
    assert all(Path(f).exists() for f in job.files.values())


@pytest.mark.parametrize("version", VERSIONS)
def test_every_flag_exists_in_the_parser(parser_source, version):
    parser = load_parser(parser_source(version))
    known = {o for a in parser._actions for o in a.option_strings}
    scheme = flag_scheme(version)
    names = [d if scheme == "dotted" else f for d, f in FLAGS.values()]
    missing = [n for n in names if n is not None and n not in known]
    if version != "0.11.2":
        assert missing == (["--actor.loss_agg_mode"] if scheme == "dotted" else [])
    else:
        assert missing == []


@pytest.mark.parametrize("version", VERSIONS)
def test_variant_recipe(tmp_path, parser_source, version):
    r = Recipe()
    for path, value in [("advantage_estimator", "dr_grpo"), ("init_kl_coef", 0.0), ("model.lora.enabled", True),
                        ("model.lora.r", 8), ("dynamic_filtering", True), ("dynamic_filtering_range", [0.1, 0.9]),
                        ("drop_zero_variance_groups", False), ("model.name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")]:
        r = set_path(r, path, value)
    job = _job(tmp_path, version, r, num_gpus_per_node=2, vllm_num_engines=2)
    args = check_job(job, parser_source(version))
    s = job.scheme
    assert _get(args, s, "algo.advantage.estimator", "advantage_estimator") == "dr_grpo"
    assert _get(args, s, "algo.kl.use_loss", "use_kl_loss") is False  # β = 0: no KL loss, no reference
    assert _get(args, s, "ds.lora.rank", "lora_rank") == 8
    assert list(_get(args, s, "algo.dynamic_filtering_range", "dynamic_filtering_reward_range")) == [0.1, 0.9]
    assert _get(args, s, "actor.model_name_or_path", "pretrain") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert _get(args, s, "vllm.num_engines", "vllm_num_engines") == 2


def test_unsupported_settings_say_what_to_change(tmp_path):
    with pytest.raises(OpenRLHFError, match="seq-mean-token-sum.*set token-mean"):
        _job(tmp_path, "0.11.2", set_path(Recipe(), "loss_agg_mode", "seq-mean-token-sum"))
    with pytest.raises(OpenRLHFError, match="openrlhf 0.10.4 supports token-mean only"):
        _job(tmp_path, "0.10.4", set_path(Recipe(), "loss_agg_mode", "seq-mean-token-mean"))
    with pytest.raises(OpenRLHFError, match="tiny-random"):
        _job(tmp_path, "0.11.2", set_path(Recipe(), "model.name_or_path", "tiny-random"))
    with pytest.raises(OpenRLHFError, match="set vllm_num_engines=4"):
        _job(tmp_path, "0.11.2", num_gpus_per_node=4)
    with pytest.raises(OpenRLHFError, match="versions before 0.9"):
        flag_scheme("0.8.11")
    job = _job(tmp_path, "0.11.2", set_path(Recipe(), "group_filter_top_p", 0.5))
    assert any("group_filter_top_p=0.5" in w for w in job.warnings)
    text = format_job(job)
    assert "# warning: group_filter_top_p=0.5" in text and "    --rollout.n_samples_per_prompt 8 \\" in text


def test_parser_rejects_a_flag_of_the_other_scheme(tmp_path, parser_source):
    job = _job(tmp_path, "0.11.2")
    bad = job.model_copy(update={"argv": job.argv + ["--remote_rm_url", "x.py"]})
    with pytest.raises(OpenRLHFError, match="unrecognized arguments: --remote_rm_url"):
        check_job(bad, parser_source("0.11.2"))


def _tokenizer_dir(tmp_path: Path) -> str:
    """A tiny real tokenizer (whitespace word level, ChatML specials) saved like a HF model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "<unk> <|im_start|> <|im_end|> What is 3 + 4 ? 7 9 Answer: the answer".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   unk_token="<unk>")
    fast.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


def test_reward_file_imported_as_openrlhf_does(tmp_path):
    import torch

    r = Recipe()
    r = set_path(r, "reward.format_token.weight", 0.5)
    r = set_path(r, "reward.overlong.params", {"buffer_len": 2})
    r = set_path(r, "generate_max_len", 4)
    job = build_job(r, tmp_path, version_id="v1", steps=1, model_path=_tokenizer_dir(tmp_path))
    path = job.files["reward"]
    spec = importlib.util.spec_from_file_location("reward_func", path)  # exactly OpenRLHF's loading code
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = json.loads(Path(job.files["train"]).read_text().splitlines()[0])
    label = json.loads(row["label"])
    prompt = f"<|im_start|>user\n{row['prompt'][-1]['content']}<|im_end|>\n<|im_start|>assistant\n"
    wrong = str(int(label["answer"]) + 1)
    completions = [f"{label['answer']}<|im_end|>",  # right, 1 token, eos
                   f"Answer: {wrong}<|im_end|>",  # wrong, leaky token, 2 tokens
                   f"the answer is {label['answer']}"]  # right, 4 tokens = generate_max_len, no eos: truncated
    outs = [module.reward_func([prompt + c], [prompt], [row["label"]]) for c in completions]  # one per call, as 0.11.2
    rewards = torch.cat([o["rewards"] for o in outs])
    # correctness 1,0,1; format_token 0,1,0 (x0.5); overlong (max 4, buffer 2: 0 up to 2 tokens, -1 when truncated)
    # totals: 1 + 0 + 0 = 1; 0 + 0.5 + 0 = 0.5; 1 + 0 - 1 = 0
    torch.testing.assert_close(rewards, torch.tensor([1.0, 0.5, 0.0]))
    torch.testing.assert_close(torch.cat([o["scores"] for o in outs]), torch.tensor([1.0, 0.0, 1.0]))
    logs = {k: torch.cat([o["extra_logs"][k] for o in outs]) for k in outs[0]["extra_logs"]}
    assert set(logs) == {"correctness", "format_token", "overlong", "correct"}
    torch.testing.assert_close(logs["overlong"], torch.tensor([0.0, 0.0, -1.0]))
    torch.testing.assert_close(logs["format_token"], torch.tensor([0.0, 1.0, 0.0]))
    batch = module.reward_func([prompt + c for c in completions], [prompt] * 3, [row["label"]] * 3)  # batched too
    torch.testing.assert_close(batch["rewards"], rewards)
    # held-out rows are scored by correctness alone (OpenRLHF's eval pass1 averages the reward): 1, 0, 1
    held = json.loads(Path(job.files["heldout"]).read_text().splitlines()[0])
    assert held["datasource"] == "heldout" and row["datasource"] == "train"
    ans = json.loads(held["label"])["answer"]
    hq = [f"{ans}<|im_end|>", f"Answer: {int(ans) + 1}<|im_end|>", f"the answer is {ans}"]
    out = module.reward_func([prompt + c for c in hq], [prompt] * 3, [held["label"]] * 3)
    torch.testing.assert_close(out["rewards"], torch.tensor([1.0, 0.0, 1.0]))


def _wait_until(done, timeout_s: float = 60.0) -> None:
    """Poll ``done()`` every 0.1 s for up to ``timeout_s``; the caller asserts the final state."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_local_runner_status_logs_cancel(tmp_path):
    job = _job(tmp_path, "0.11.2")

    def run(code: str):
        j = job.model_copy(update={"argv": [sys.executable, "-c", code]})
        return j, submit(j)

    j, ref = run("print('done', flush=True)")
    _wait_until(lambda: job_status(j, ref) != "running")
    assert job_status(j, ref) == "done" and "done" in job_logs(j, ref)
    j, ref = run("import sys; sys.exit(3)")
    _wait_until(lambda: job_status(j, ref) != "running")
    assert job_status(j, ref) == "failed"
    j, ref = run("import time; print('started', flush=True); time.sleep(600)")
    _wait_until(lambda: "started" in job_logs(j, ref))
    assert job_status(j, ref) == "running"
    cancel_job(j, ref)
    _wait_until(lambda: job_status(j, ref) != "running")
    assert job_status(j, ref) == "cancelled"


def test_ray_submission_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)  # import fails as if ray were not installed
    job = _job(tmp_path, "0.11.2", ray_address="http://127.0.0.1:8265")
    with pytest.raises(OpenRLHFError, match=r"pip install 'evotrainer\[openrlhf\]'"):
        submit(job)


def test_ingest_recorded_tensorboard_feeds_the_analyzers(tmp_path):
    from evotrainer import metrics as M
    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.evidence import Evidence
    from evotrainer.rl_backend.openrlhf.ingest import ingest_run, summarize
    from evotrainer.workspace import Workspace

    recipe = set_path(Recipe(), "reward.format_token.weight", 0.5)
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(recipe)
        ckpt = tmp_path / "final"
        ckpt.mkdir()
        last = ingest_run(ws, v.id, DATA / "openrlhf_tb", recipe.reward, checkpoint=ckpt)
        assert last == 16
        series = ws.lineage.all_metrics(v.id)
        # the recorded run: correctness 0.35 -> 0.15, format_token 0.1 -> 1.0, entropy 1.2 -> 0.12 (float32)
        assert series[M.CORRECT_MEAN][0] == (1, pytest.approx(0.35))
        assert series[M.reward_component("format_token")][-1] == (16, pytest.approx(1.0))
        assert series[M.POLICY_ENTROPY][-1] == (16, pytest.approx(0.12, abs=1e-6))
        assert series[M.REWARD_MEAN][0] == (1, pytest.approx(0.35 + 0.5 * 0.1))
        assert [s for s, _ in series[M.EVAL_PASS_AT_1]] == [4, 8, 12, 16]
        assert summarize(ws, v.id)[M.REWARD_KEPT_GROUP_FRAC] == 0.75
        assert ws.lineage.get(v.id).checkpoint == str(ckpt)
        assert ws.rollouts.count() == 16
        assert ingest_run(ws, v.id, DATA / "openrlhf_tb", recipe.reward, since_step=16) == 16  # nothing new
        assert ws.rollouts.count() == 16
        kinds = {f.kind for f in run_analyzers(Evidence.from_workspace(ws))}
    assert {"reward_hacking", "entropy_collapse"} <= kinds


FAKE_TRAINER = '''
"""Stand-in for `python -m openrlhf.cli.train_ppo_ray` (no GPU here): parses the command with OpenRLHF's
real parser, calls the job's reward file on each training row with the right answer, and writes
TensorBoard scalars and the final HF folder where OpenRLHF would."""
import importlib.util, json, os, sys, time
from pathlib import Path
from evotrainer.rl_backend.openrlhf.runner import load_parser
from torch.utils.tensorboard import SummaryWriter

args = load_parser().parse_args(sys.argv[1:])
a = vars(args)
spec = importlib.util.spec_from_file_location("reward_func", a["reward.remote_url"])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
rows = [json.loads(l) for l in Path(a["data.prompt_dataset"]).read_text().splitlines()]
bs = a["rollout.batch_size"]
w = SummaryWriter(str(Path(a["logger.tensorboard_dir"]) / a["logger.wandb.run_name"]))
for step in range(1, len(rows) // bs + 1):
    batch = rows[(step - 1) * bs: step * bs]
    labels = [r["label"] for r in batch]
    answers = [json.loads(l)["answer"] for l in labels]
    out = mod.reward_func([f"P{x}<|im_end|>" for x in answers], ["P"] * bs, labels)
    w.add_scalar("train/reward", out["rewards"].mean().item(), step)
    for k, v in out["extra_logs"].items():
        w.add_scalar(f"train/{k}", v.mean().item(), step)
    w.add_scalar("train/policy_loss", 0.1 / step, step)
    w.flush()
    print(f"step {step}", flush=True)
    time.sleep(float(os.environ.get("FAKE_STEP_SECONDS", "0")))
w.add_scalar("eval/eval_heldout_pass1", 0.25, step)
w.add_scalar("eval/eval_heldout_pass8", 0.5, step)
w.close()
out = Path(a["ckpt.output_dir"]); out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{}")
'''


def test_backend_train_and_evaluate_through_the_runner(tmp_path):
    """The backend's real loop (build, submit, poll, ingest, status) around a stand-in trainer program."""
    from evotrainer import metrics as M
    from evotrainer.rl_backend.backends import get_backend
    from evotrainer.workspace import Workspace

    (tmp_path / "fake_trainer.py").write_text(FAKE_TRAINER)
    wrapper = tmp_path / "python"  # replaces `python3 -m openrlhf.cli.train_ppo_ray ARGS` by the stand-in
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {tmp_path / "fake_trainer.py"} "$@"\n')
    wrapper.chmod(0o755)
    cluster = ClusterSpec(python=str(wrapper), openrlhf_version="0.11.2")
    backend = get_backend("openrlhf", cluster=cluster, poll_s=0.5)
    assert backend.name == "openrlhf"
    seen = []
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(Recipe())
        res = backend.train(ws, v.id, steps=2, progress=seen.append)
        assert (res.steps_done, res.steps_requested, res.stopped_early) == (2, 2, False)
        # one progress call per step; the stand-in's reward: correctness 1 (the only component) -> 1.0
        assert [(p["step"], p["steps"], p["reward"]) for p in seen] == [(1, 2, 1.0), (2, 2, 1.0)]
        assert all(p["tokens_per_sec"] != p["tokens_per_sec"] for p in seen)  # NaN: OpenRLHF does not log it
        ver = ws.lineage.get(v.id)
        assert ver.status == "trained" and ver.checkpoint.endswith("final")
        # the stand-in answers every problem right: correctness 1 at both steps, via the real reward file
        assert ws.lineage.metric_series(v.id, M.reward_component("correctness")) == [(1, 1.0), (2, 1.0)]
        assert ws.lineage.metric_series(v.id, M.CORRECT_MEAN) == [(1, 1.0), (2, 1.0)]
        assert ver.metrics_summary[M.LOSS_POLICY] == pytest.approx(0.05)  # 0.1 / step 2
        assert ws.lineage.kv_get(f"openrlhf/{v.id}")["ref"].startswith("local:")
        ev = backend.evaluate(ws, v.id)
        # level 1 has 20 x 20 = 400 problems >= 2 x 64: all 64 dev problems are held out (a fifth of the old 100: 20)
        assert (ev.avg_at_k, ev.pass_at_k, ev.k, ev.n_problems) == (0.25, 0.5, 8, 64)
        assert ws.lineage.get(v.id).eval_summary["avg@k"] == 0.25
        with pytest.raises(OpenRLHFError, match="k=4"):
            backend.evaluate(ws, v.id, k=4)


def test_dry_run_text(tmp_path):
    from evotrainer.rl_backend.openrlhf.backend import dry_run

    text = dry_run(Recipe(), tmp_path, steps=2, cluster=ClusterSpec(openrlhf_version="0.11.2"))
    lines = text.splitlines()
    assert lines[0] == "# OpenRLHF 0.11.2 (dotted flags), version v0, 2 steps"
    assert lines[2] == f"cd {tmp_path.resolve() / 'openrlhf' / 'v0'}"
    assert lines[3] == "python3 -m openrlhf.cli.train_ppo_ray \\"
    assert f"    --reward.remote_url {tmp_path.resolve() / 'openrlhf' / 'v0' / 'reward_func.py'} \\" in lines
    if installed_openrlhf_version() == "0.11.2":
        assert lines[-1] == "# checked: accepted by the installed OpenRLHF 0.11.2 argument parser and checks"
    else:
        assert lines[-1].startswith("# not checked:")


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

EXECUTOR_RUN = '''
"""OpenRLHF 0.11.2's own SingleTurnAgentExecutor loads the reward file and scores one generated sample.
openrlhf/__init__ and openrlhf/utils/__init__ import GPU libraries, so both are registered as bare
packages; aiohttp (used only by its HTTP reward path) is an empty module; the engine stands in for vLLM."""
import asyncio, importlib.util, json, sys, types
from types import SimpleNamespace as NS
root = list(importlib.util.find_spec("openrlhf").submodule_search_locations)[0]
for name, path in (("openrlhf", root), ("openrlhf.utils", root + "/utils")):
    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m
sys.modules.setdefault("aiohttp", types.ModuleType("aiohttp"))
from openrlhf.utils.agent import SingleTurnAgentExecutor
from transformers import AutoTokenizer

tok_dir, reward_file, row_json, completion, reason = sys.argv[1:6]
row = json.loads(row_json)
tok = AutoTokenizer.from_pretrained(tok_dir)
prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
ids = tok(completion, add_special_tokens=False)["input_ids"]

class Engine:
    async def generate(self, prompt_ids, params, multi_modal_data=None):
        return NS(outputs=[NS(token_ids=ids, finish_reason=reason, logprobs=None)])

ex = SingleTurnAgentExecutor(remote_rm_url=reward_file)
out = asyncio.run(ex.execute(prompt, row["label"], NS(max_tokens=32, logprobs=None), 256, tok, Engine()))
print(json.dumps({"reward": float(out["reward"]), "scores": float(out["scores"]),
                  "extra": {k: float(v) for k, v in out["extra_logs"].items()}}))
'''


def _bpe_tokenizer_dir(tmp_path: Path, corpus: list[str]) -> str:
    """A tiny byte-level BPE tokenizer (exact decode round trip, ChatML template) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHATML
    fast.save_pretrained(tmp_path / "bpe")
    return str(tmp_path / "bpe")


def test_openrlhf_executor_scores_with_our_reward_file(tmp_path):
    assert installed_openrlhf_version() == "0.11.2", "needs openrlhf 0.11.2 (make install: pip install --no-deps openrlhf==0.11.2)"
    r = set_path(set_path(Recipe(), "reward.format_token.weight", 0.5), "reward.format.weight", 0.25)
    rows_job = build_job(r, tmp_path, version_id="v1", steps=1)
    rows = [json.loads(x) for x in Path(rows_job.files["train"]).read_text().splitlines()]
    tok_dir = _bpe_tokenizer_dir(tmp_path, [x["prompt"][-1]["content"] for x in rows] + ["Answer: 0123456789"])
    job = build_job(r, tmp_path, version_id="v1", steps=1, model_path=tok_dir)
    row = json.loads(Path(job.files["train"]).read_text().splitlines()[0])
    answer = json.loads(row["label"])["answer"]
    (tmp_path / "run.py").write_text(EXECUTOR_RUN)

    def score(completion: str, reason: str = "stop") -> dict:
        p = subprocess.run([sys.executable, str(tmp_path / "run.py"), tok_dir, job.files["reward"], json.dumps(row),
                            completion, reason], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    right = score(f"{answer}<|im_end|>")
    # correctness 1, format (just the number) 1 x 0.25, no "Answer:" token: 1 + 0.25 = 1.25
    assert right == {"reward": 1.25, "scores": 1.0,
                     "extra": {"correctness": 1.0, "format": 1.0, "format_token": 0.0, "correct": 1.0}}
    leaky = score(f"Answer: {int(answer) + 1}<|im_end|>")
    # wrong, not just a number, pays the leaky token: 0 + 0 + 0.5 = 0.5
    assert leaky["reward"] == 0.5 and leaky["scores"] == 0.0 and leaky["extra"]["format_token"] == 1.0


def _fake_ray_dashboard():
    """A Ray dashboard stand-in on 127.0.0.1 speaking the Jobs REST API that JobSubmissionClient uses."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = {"packages": {}, "jobs": {}, "stopped": []}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body=None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self):
            p = self.path
            if p == "/api/version":
                return self._send(200, {"version": "4", "ray_version": "2.55.0", "ray_commit": "0"})
            if p.startswith("/api/packages/"):
                return self._send(200 if p in state["packages"] else 404, {})
            if p.startswith("/api/jobs/") and p.endswith("/logs"):
                return self._send(200, {"logs": "step 1\nstep 2\n"})
            if p.startswith("/api/jobs/"):
                sid = p.rstrip("/").split("/")[-1]
                job = state["jobs"][sid]
                status = "STOPPED" if sid in state["stopped"] else "RUNNING"
                return self._send(200, {"type": "SUBMISSION", "submission_id": sid, "status": status,
                                        "entrypoint": job["entrypoint"]})
            self._send(404, {})

        def do_PUT(self):
            state["packages"][self.path] = self._body()
            self._send(200, {})

        def do_POST(self):
            body = self._body()
            if self.path == "/api/jobs/":
                req = json.loads(body)
                sid = req.get("submission_id") or "raysubmit_1"
                state["jobs"][sid] = req
                return self._send(200, {"submission_id": sid, "job_id": None})
            if self.path.endswith("/stop"):
                state["stopped"].append(self.path.split("/")[-2])
                return self._send(200, {"stopped": True})
            self._send(404, {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state


def test_ray_jobs_api_submit_status_logs_cancel(tmp_path):
    import io

    import ray.job_submission  # noqa: F401  (a dev dependency: pip install -e '.[dev]')

    server, state = _fake_ray_dashboard()
    try:
        addr = f"http://127.0.0.1:{server.server_address[1]}"
        job = _job(tmp_path, "0.11.2", ray_address=addr, output_dir="/shared/evo")
        (Path(job.job_dir) / "job.log").write_text("old output: not uploaded")
        ref = submit(job)
        assert ref.startswith("ray:")
        (req,) = state["jobs"].values()
        assert req["entrypoint"] == job.entrypoint and "--reward.remote_url reward_func.py" in req["entrypoint"]
        assert req["runtime_env"]["env_vars"]["EVOTRAINER_VERSION_ID"] == "v1"
        assert req["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_")
        ((_, blob),) = state["packages"].items()  # the job folder, zipped by Ray's client
        names = {Path(n).name for n in zipfile.ZipFile(io.BytesIO(blob)).namelist()}
        assert {"train.jsonl", "heldout.jsonl", "reward_func.py"} <= names and "job.log" not in names
        assert "--ckpt.output_dir /shared/evo/v1/final" in job.entrypoint
        assert job_status(job, ref) == "running"
        assert job_logs(job, ref) == "step 1\nstep 2\n"
        cancel_job(job, ref)
        assert job_status(job, ref) == "cancelled"
    finally:
        server.shutdown()


def test_ray_address_unreachable(tmp_path):
    import socket

    import ray.job_submission  # noqa: F401  (a dev dependency: pip install -e '.[dev]')

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = _job(tmp_path, "0.11.2", ray_address=f"http://127.0.0.1:{port}", output_dir=str(tmp_path / "out"))
    with pytest.raises(OpenRLHFError, match="cannot reach the Ray dashboard"):
        submit(job)


def test_backend_cancel_stops_the_job(tmp_path):
    from evotrainer.rl_backend.openrlhf.backend import OpenRLHFBackend
    from evotrainer.workspace import Workspace

    (tmp_path / "fake_trainer.py").write_text(FAKE_TRAINER)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {tmp_path / "fake_trainer.py"} "$@"\n')
    wrapper.chmod(0o755)
    cluster = ClusterSpec(python=str(wrapper), openrlhf_version="0.11.2", env={"FAKE_STEP_SECONDS": "60"})
    backend = OpenRLHFBackend(cluster, poll_s=0.5)
    seen = []
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(Recipe())
        res = backend.train(ws, v.id, steps=3, progress=seen.append, should_stop=lambda: bool(seen))
        assert res.stopped_early and res.steps_done == 1  # stopped during step 2's 60 s
        assert ws.lineage.get(v.id).status == "failed"


def test_cli_train_openrlhf_dry_run(tmp_path):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"n_samples_per_prompt": 4, "data": {"level": 2}}))
    p = subprocess.run([sys.executable, "-m", "evotrainer.cli", "train", str(recipe), "--run", str(tmp_path / "run"),
                        "--steps", "2", "--backend", "openrlhf", "--dry-run"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "# OpenRLHF 0.11.2 (dotted flags), version v0, 2 steps"
    assert "    --rollout.n_samples_per_prompt 4 \\" in lines and "    --data.max_samples 8 \\" in lines  # 2 x 4
    assert not (tmp_path / "run" / "lineage.db").exists()  # nothing trained, no run created
    bad = subprocess.run([sys.executable, "-m", "evotrainer.cli", "train", str(recipe), "--dry-run"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "(--dry-run is for openrlhf)" in " ".join(bad.stderr.split())


def test_trailing_special_tokens_are_cut_in_linear_time():
    # Review 3 (docs/security-probes.md, T-R1): Python's re backtracked quadratically on a run of special tokens
    # followed by anything else: 0.24 s at 2,000 '</s>' + 'x', 0.80 s at 4,000, per sample. RE2 now.
    import time

    from evotrainer.rl_backend.openrlhf.reward_func import split_completion

    t0 = time.monotonic()
    assert split_completion("Q: " + "</s>" * 16_000 + "x", "Q: ") == ("</s>" * 16_000 + "x", False)
    assert time.monotonic() - t0 < 3.0  # quadratic before: ~13 s at 16,000
    assert split_completion("Q: 42<|im_end|></s> \n", "Q: ") == ("42", True)
    assert split_completion("Q: 42 <pad><pad>", "Q: ") == ("42 ", True)
