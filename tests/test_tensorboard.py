"""TensorBoard output of the local trainer (rl_backend/tb_writer.py), read back with tensorboard's
EventAccumulator: lineage-global steps, held-out eval/* scalars, hparams (the recipe's flat fields),
text samples. A tiny random model trains a root for 3 steps and a child for 2."""

from __future__ import annotations

import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from evotrainer import metrics as M
from evotrainer.intervention import Intervention
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.rl_backend.tb_writer import hparams_of, samples_markdown
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 4, "rollout_batch_size": 2,
        "generate_max_len": 4, "init_kl_coef": 0.0, "drop_zero_variance_groups": False,
        "eval": {"k": 2, "max_problems": 2}}


def _events(folder):
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("tb") / "run", writer=True)
    root = ws.lineage.create_root(validate_recipe(TINY))
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    be.train(ws, root.id, 3)
    child = ws.lineage.branch(root.id, Intervention(path="temperature", old=1.0, new=0.7, category="rollout"))
    be.train(ws, child.id, 2)
    res = be.evaluate(ws, child.id)
    yield ws, root.id, child.id, res
    ws.close()


def test_child_steps_continue_after_the_parent(trained):
    ws, root, child, _ = trained
    assert ws.lineage.step_offset(root) == 0
    assert ws.lineage.step_offset(child) == 3  # the root trained steps 0, 1, 2
    r, c = _events(ws.root / "tb" / root), _events(ws.root / "tb" / child)
    assert [e.step for e in r.Scalars(M.REWARD_MEAN)] == [0, 1, 2]
    assert [e.step for e in c.Scalars(M.REWARD_MEAN)] == [3, 4]  # child steps 0, 1 -> global 3 + 0, 3 + 1
    # the values are the stored metrics, step for step
    stored = [x for _, x in ws.lineage.metric_series(child, M.REWARD_MEAN)]
    assert [e.value for e in c.Scalars(M.REWARD_MEAN)] == pytest.approx(stored, abs=1e-6)


def test_heldout_eval_scalars_at_the_last_global_step(trained):
    ws, _, child, res = trained
    c = _events(ws.root / "tb" / child)
    # the child's last step is its step 1 = global step 3 + 1 = 4
    assert [(e.step, round(e.value, 6)) for e in c.Scalars(M.EVAL_AVG_AT_K)] == [(4, round(res.avg_at_k, 6))]
    assert [e.value for e in c.Scalars(M.EVAL_PASS_AT_K)] == pytest.approx([res.pass_at_k], abs=1e-6)
    assert [e.value for e in c.Scalars(M.EVAL_PASS_AT_1)] == pytest.approx([res.pass_at_1], abs=1e-6)
    # 2 problems x k=2 samples: Avg@k is a multiple of 1/4
    assert (res.avg_at_k * 4) == pytest.approx(round(res.avg_at_k * 4))


def test_hparams_are_the_recipe_flat_fields(trained):
    ws, _, child, _ = trained
    c = _events(ws.root / "tb" / child)
    content = c.PluginTagToContent("hparams")
    ssi = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hp = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in ssi.hparams.items()}
    assert hp["temperature"] == pytest.approx(0.7)  # the child's intervention
    assert hp["n_samples_per_prompt"] == 4 and hp["rollout_batch_size"] == 2
    assert hp["model.name_or_path"] == "tiny-random"
    assert set(hp) == set(hparams_of(ws.lineage.get(child).recipe))
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in exp.metric_infos] == ["eval/avg@k", "eval/pass@k", "reward/mean"]


def test_text_samples_per_step(trained):
    ws, root, _, _ = trained
    r = _events(ws.root / "tb" / root)
    events = r.Tensors("samples/text_summary")
    assert [e.step for e in events] == [0, 1, 2]
    text = events[0].tensor_proto.string_val[0].decode()
    rows = ws.rollouts.sql(f"SELECT prompt, completion, reward FROM rollouts WHERE version_id='{root}' AND step=0 "
                           "AND split='train' ORDER BY group_id, sample_idx LIMIT 3")
    assert text.count("\n") == 1 + 3  # header, rule, 3 samples
    assert f"{rows[0]['reward']:.3f}" in text.splitlines()[2]


def test_samples_markdown_escapes_cells():
    md = samples_markdown([{"prompt": "a|b", "completion": "x\ny", "reward": 0.5, "correct": 1.0}])
    assert md.splitlines()[2] == "| a\\|b | x<br>y | 0.500 | 1.0 |"
