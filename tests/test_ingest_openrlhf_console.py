"""OpenRLHF's console: tqdm bars whose postfix holds the step's numbers (``ingest_formats.parse_tqdm_postfix_log``).

The logs are written here by tqdm itself (the library OpenRLHF draws its bars with), in the loop structure of
OpenRLHF's ``openrlhf/trainer/ppo_trainer.py`` (``fit``: the ``Episode [e/E]`` bar, ``pbar.set_postfix(status)`` after
each update; ``ppo_train``: a ``Train epoch [e/E]`` bar per update, ``pbar.set_postfix(short_status)`` per
micro-batch) and ``trainer/ray/ppo_actor.py`` (the newer short names), with the sample text the trainer prints
between updates, so the test reads what tqdm writes, ``\\r`` redraws included.
"""

from __future__ import annotations

import io
import math

import pytest
from tqdm import tqdm

from evotrainer import metrics as M
from evotrainer.harness.ingest import ingest, parse_text_log
from evotrainer.harness.ingest_formats import parse_tqdm_postfix_log

STEPS = 6
MICRO = 3


def status(step: int) -> dict[str, float]:
    """The update's status dict at global step ``step`` (OpenRLHF's keys)."""
    return {"policy_loss": 0.01 * step, "actor_lr": 1e-6, "kl": 0.0005 * step, "reward": 0.1 * step,
            "return": 0.05 * step, "response_length": 100.0 + 50 * step, "total_length": 400.0 + 50 * step,
            "ppo_clip_ratio": 0.0}


def micro(step: int, i: int) -> dict[str, float]:
    """Micro-batch ``i`` of the update at ``step``: the status plus ``i - 1`` (mean over i = 1..3: the status + 1)."""
    s = status(step)
    return {k: v + (i - 1) for k, v in s.items()}


def openrlhf_console(outer: bool, short: str = "old", episodes: int = 1) -> str:
    """What OpenRLHF's rank 0 writes: an Episode bar of STEPS ticks (``outer``: with the status postfix) and one
    Train epoch bar of MICRO ticks per step (short names: ``old`` pg / rm / glen, ``new`` act_loss / reward / gen_len)."""
    buf = io.StringIO()
    names = ({"pg": "policy_loss", "rm": "reward", "ret": "return", "glen": "response_length", "tlen": "total_length",
              "kl": "kl", "act_lr": "actor_lr"} if short == "old" else
             {"act_loss": "policy_loss", "reward": "reward", "return": "return", "gen_len": "response_length",
              "tot_len": "total_length", "kl": "kl", "act_lr": "actor_lr"})
    for ep in range(episodes):
        _episode(buf, ep, episodes, names, outer)
    return buf.getvalue()


def _episode(buf: io.StringIO, ep: int, episodes: int, names: dict[str, str], outer: bool) -> None:
    pbar = tqdm(range(STEPS), desc=f"Episode [{ep + 1}/{episodes}]", file=buf, mininterval=0, ascii=False)
    for step in range(ep * STEPS + 1, (ep + 1) * STEPS + 1):
        buf.write("\nsystem\nYou are a helpful assistant.\nuser\nWhat is 3 + 4?\nassistant\n7\n")
        inner = tqdm(range(MICRO), desc="Train epoch [1/1]", file=buf, mininterval=0)
        for i in range(1, MICRO + 1):
            m = micro(step, i)
            inner.set_postfix({k: m[v] for k, v in names.items()})
            inner.update()
        inner.close()
        if outer:
            pbar.set_postfix(status(step))
        pbar.update()
    pbar.close()


def g3(x: float) -> float:
    """tqdm's rendering of a postfix number: ``.3g``."""
    return float(f"{x:.3g}")


def test_the_episode_bar_gives_one_record_per_step():
    text = openrlhf_console(outer=True)
    assert "\r" in text and "Episode [1/1]" in text and "pg=" in text  # tqdm's redraws and both bars are there
    rec = parse_tqdm_postfix_log(text)
    assert sorted(rec) == list(range(1, STEPS + 1))
    for step in rec:
        assert rec[step] == {k: g3(v) for k, v in status(step).items()}


def test_episodes_go_on_and_ray_prefixes_are_read():
    """Episode 2's bar counts from 0 again: its steps follow episode 1's; OpenRLHF on Ray prints its actors' lines
    with a ``(Actor pid=...)`` prefix."""
    text = openrlhf_console(outer=True, episodes=2).replace("\rEpisode", "\r(PPOTrainer pid=4242) Episode")
    assert text.count("(PPOTrainer pid=4242) Episode [2/2]") > STEPS
    rec = parse_tqdm_postfix_log(text)
    assert sorted(rec) == list(range(1, 2 * STEPS + 1))
    assert rec[STEPS + 1]["reward"] == g3(0.1 * (STEPS + 1))


@pytest.mark.parametrize("short", ["old", "new"])
def test_without_an_episode_postfix_each_train_epoch_bar_is_a_step(short):
    """Each update's micro-batches averaged (OpenRLHF's status_mean): the status + 1, short names renamed."""
    rec = parse_tqdm_postfix_log(openrlhf_console(outer=False, short=short))
    assert sorted(rec) == list(range(1, STEPS + 1))
    for step, r in rec.items():
        want = {k: sum(g3(micro(step, i)[k]) for i in range(1, MICRO + 1)) / MICRO
                for k in ("policy_loss", "reward", "return", "response_length", "total_length", "kl", "actor_lr")}
        assert r.keys() == want.keys() and all(math.isclose(r[k], want[k], rel_tol=1e-12) for k in want)


def test_the_log_is_diagnosed_with_our_names(tmp_path):
    p = tmp_path / "train.log"
    p.write_text(openrlhf_console(outer=True), encoding="utf-8")
    assert parse_text_log(p.read_text())[1] == "tqdm bars with numbers (OpenRLHF)"
    ev = ingest(p)
    (v,) = ev.versions
    steps, reward = ev.series(v, M.REWARD_MEAN)
    assert steps.tolist() == list(range(1, STEPS + 1)) and reward.tolist() == [g3(0.1 * s) for s in steps]
    assert ev.series(v, M.COMPLETIONS_MEAN_LENGTH)[1].tolist() == [100.0 + 50 * s for s in steps]
    assert ev.series(v, M.LOSS_POLICY)[1].tolist() == [g3(0.01 * s) for s in steps]
    assert ev.has(v, M.POLICY_LR) and ev.has(v, M.POLICY_KL)


def test_bars_without_numbers_are_no_records():
    """A bar with only its rate (TRL's console between dicts, any download bar) gives nothing."""
    buf = io.StringIO()
    for _ in tqdm(range(5), desc="Generating", file=buf, mininterval=0):
        pass
    assert parse_tqdm_postfix_log(buf.getvalue()) == {}
    # a bar with no description is an inner bar: the first is step 1; 'nan' is kept (evidence), 'abc' is no number
    rec = parse_tqdm_postfix_log(" 40%|####      | 2/5 [00:01<00:01,  2.00it/s, loss=nan, note=abc]\n")
    assert list(rec) == [1] and list(rec[1]) == ["loss"] and math.isnan(rec[1]["loss"])


def test_steps_whose_numbers_repeat_stay_steps():
    """A stuck run logs the same status at every step (policy_loss=0, kl=0, reward=0): 6 ticks, 6 steps (they were
    one run of equal drawings, one step)."""
    buf = io.StringIO()
    pbar = tqdm(range(STEPS), desc="Episode [1/1]", file=buf, mininterval=0)
    for _ in range(STEPS):
        pbar.set_postfix({"policy_loss": 0.0, "kl": 0.0, "reward": 0.0, "response_length": 512.0})
        pbar.update()
    pbar.close()
    rec = parse_tqdm_postfix_log(buf.getvalue())
    assert sorted(rec) == list(range(1, STEPS + 1)) and all(r["reward"] == 0.0 for r in rec.values())


def test_ppo_epochs_of_one_update_are_one_step():
    """max_epochs 2: each update draws 'Train epoch [1/2]' and '[2/2]' bars; 3 updates are 3 steps (they were 6),
    each the mean of both epochs' micro-batches (OpenRLHF's status_mean over status_list)."""
    buf = io.StringIO()
    for step in range(1, 4):
        for epoch in (1, 2):
            bar = tqdm(range(2), desc=f"Train epoch [{epoch}/2]", file=buf, mininterval=0)
            for i in (1, 2):
                bar.set_postfix({"pg": float(step), "rm": 0.1 * step + 0.01 * (2 * (epoch - 1) + i)})
                bar.update()
            bar.close()
    rec = parse_tqdm_postfix_log(buf.getvalue())
    assert sorted(rec) == [1, 2, 3]
    assert rec[2]["policy_loss"] == 2.0 and math.isclose(rec[2]["reward"], 0.2 + 0.01 * 2.5)


def test_bars_pasted_as_their_final_lines_are_one_step_each():
    """A paste that kept only each inner bar's last drawing ('4/4 [...]' lines): a new postfix at the total after the
    total was drawn starts a new bar (10 lines were one step)."""
    lines = "".join(f"Train epoch [1/1]: 100%|##########| 4/4 [00:20<00:00,  5.0s/it, act_loss=0.0{i}, "
                    f"reward=0.{i}, gen_len=30{i}, kl=0.001, act_lr=1e-06]\n" for i in range(10))
    rec = parse_tqdm_postfix_log(lines)
    assert sorted(rec) == list(range(1, 11)) and rec[4]["reward"] == 0.3 and rec[4]["response_length"] == 303.0
