"""Reinforcement fine-tuning's reward: the job's grader (`whetstone.graders`) as a trl reward
function, the RFT data gate, and the mean reward of a model on held-out prompts.

- `GraderReward`: called by trl's GRPOTrainer with the prompts, the sampled completions and the
  dataset's other columns; each row's `item` (the whole training row, as OpenAI's `{{item.x}}`
  sees it) travels as the JSON string column `item_json`. The samples of one call are graded
  concurrently on one event loop kept for the run (judge HTTP clients and the python sandbox's
  gate live on it). A grader error (a python grader that raised, a judge that refused) scores 0.0,
  as in OpenAI's API, and is counted. Each call's sub-rewards (multi graders) and error count are
  kept until the next logged step (`SubRewards`, a trainer callback that adds them to the logs).
- `check_rft_rows`: the data gate (last message `user`, every `{{item.x}}` present), as a
  UserError naming the file and lines.
- `prompt_rows`: rows -> `PromptRow`s (the conversation and the row as the grader's item); their
  `record()` is the dataset row trl reads: {"prompt": messages, "item_json": row}.
- `mean_reward`: greedy (or sampled) completions of held-out prompts, graded: the validation
  figure at checkpoints and the number an eval gate compares between candidate and base.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from whetstone.graders import AnyGrader, GraderEnvironment, RunResult, run_grader
from whetstone.graders.rft import RftRecord, RowMessage, check_rows

from ..domain.recipe_io import Validation
from .errors import UserError


def message_text(content: Any) -> str:
    """The text of a completion's message content as trl hands it over (a string or content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def row_text(message: RowMessage) -> str:
    if isinstance(message.content, list):   # content parts: the text ones
        return "".join(p.text or "" for p in message.content)
    return message.content or ""


def check_rft_rows(rows: list[tuple[int, Any]], grader: AnyGrader, name: str) -> None:
    problems, total = check_rows(rows, grader, limit=5)
    if total:
        listed = "; ".join(str(p) for p in problems)
        raise UserError(f"{name}: {total} problem(s) for reinforcement fine-tuning: {listed}",
                        code="invalid_rft_data",
                        advice=["every row needs `messages` ending with a user turn",
                                "every {{item.x}} the grader reads must be a field of every row"])


@dataclass(frozen=True)
class PromptRow:
    """One prompt of the run: the conversation (chat-template turns) and the row as the grader's item."""
    prompt: list[dict[str, str]]
    item: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """The dataset row trl reads: a conversational `prompt` and the item as the JSON column `item_json`."""
        return {"prompt": self.prompt, "item_json": json.dumps(self.item, ensure_ascii=False)}


def prompt_rows(rows: list[tuple[int, Any]], name: str = "the file") -> list[PromptRow]:
    """The rows (checked by `check_rft_rows`) read once as typed prompts."""
    out = []
    for line, row in rows:
        try:
            record = RftRecord.parse(row)
        except ValidationError as exc:
            raise UserError(f"{name}: line {line}: {exc.errors()[0]['msg']} at "
                            f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}", code="invalid_rft_data") from exc
        out.append(PromptRow([{"role": m.role, "content": row_text(m)} for m in record.messages], record.item))
    return out


class GraderReward:
    """The grader as a trl reward function (`reward_sign` -1 trains against it: tests and benches
    that plant a candidate whose reward was wrong)."""

    def __init__(self, grader: AnyGrader, env: GraderEnvironment, reward_sign: float = 1.0) -> None:
        self.grader, self.env, self.sign = grader, env, reward_sign
        self.__name__ = grader.name     # trl names the reward in its logs after this
        self.loop = asyncio.new_event_loop()
        self.pending: dict[str, list[float]] = defaultdict(list)
        self.errors = 0

    def grade(self, texts: list[str], items: list[Any]) -> list[RunResult]:
        async def all_of() -> list[RunResult]:
            return list(await asyncio.gather(*(run_grader(self.grader, t, i, self.env) for t, i in zip(texts, items))))

        return self.loop.run_until_complete(all_of())

    def __call__(self, prompts: list[Any], completions: list[Any], item_json: list[str], **_: Any) -> list[float]:
        texts = [message_text(c[-1].get("content")) if isinstance(c, list) else str(c) for c in completions]
        results = self.grade(texts, [json.loads(x) for x in item_json])
        for result in results:
            self.errors += int(result.metadata.errors.any())
            for name, value in result.sub_rewards.items():
                self.pending[name].append(value)
        return [self.sign * r.reward for r in results]

    def drain(self) -> dict[str, float]:
        """Mean sub-rewards and the grader errors since the last call (for the step's log)."""
        out = {f"sub_reward/{name}": statistics.fmean(v) for name, v in self.pending.items() if v}
        out["grader_errors"] = self.errors
        self.pending.clear()
        self.errors = 0
        return out

    def close(self) -> None:
        self.loop.run_until_complete(self.env.close())
        self.loop.close()


def sub_rewards_callback(reward: GraderReward):
    """Adds the step's sub-rewards and grader error count to the logs the platform turns into
    progress events (placed before the platform's callback)."""
    from transformers import TrainerCallback

    class SubRewards(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "loss" in logs:
                logs.update(reward.drain())

    return SubRewards()


def mean_reward(model, tokenizer, rows: list[PromptRow], reward: GraderReward, *, max_new_tokens: int,
                samples: int = 1, seed: int = 0) -> Validation:
    """Mean and spread of the grader's reward (sign applied) over completions of `rows` (prompt_rows);
    one greedy completion per prompt, or `samples` sampled ones."""
    import torch

    was_training = model.training
    model.eval()
    rewards: list[float] = []
    try:
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        for row in rows:
            ids = tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            ids = {k: v.to(model.device) for k, v in ids.items()}
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=samples > 1,
                                     num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id,
                                     use_cache=True)
            start = ids["input_ids"].shape[1]
            texts = [tokenizer.decode(seq[start:], skip_special_tokens=True) for seq in out]
            results = reward.grade(texts, [row.item] * len(texts))
            rewards += [reward.sign * r.reward for r in results]
    finally:
        model.train(was_training)
    mean = statistics.fmean(rewards) if rewards else math.nan
    return Validation(reward=mean, reward_std=statistics.pstdev(rewards) if rewards else math.nan,
                      samples=len(rewards))
