"""`whet graders validate|run`: try a reinforcement fine-tuning grader before spending GPU time.

  whet graders validate grader.json                                  POST /v1/fine_tuning/alpha/graders/validate
  whet graders run grader.json --sample sample.txt --item item.json  POST /v1/fine_tuning/alpha/graders/run

A grader file holds one grader object in OpenAI's shape (`{"type": "string_check", ...}`). It is read
and checked here first (`read_grader`: JSON that parses, OpenAI's field names, templates only in the
`item` and `sample` namespaces), so a typo is named before any request; what only the deployment
knows (judge models, the python sandbox, cosine's embeddings endpoint) the API checks. `jobs create
--method reinforcement --grader FILE` reads the file the same way."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from whetstone.graders import GraderInvalid, parse_grader, references
from whetstone.graders.engine import RunResult
from whetstone.graders.models import AnyGrader, Grader, MultiGrader

from .client import Api
from .errors import BadInput
from .output import print_result


def read_json_file(path: str, what: str) -> Any:
    """The file's JSON value; a missing file or bad JSON names the file, line and column."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no such {what} file: {p}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInput(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"{p}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from exc


def read_grader(path: str) -> dict[str, Any]:
    """The grader object of a grader file, checked locally (fields and templates, naming the field)."""
    data = read_json_file(path, "grader")
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a grader file holds one JSON object "
                              f"({{\"type\": \"string_check\", ...}}), not a {type(data).__name__}")
    try:
        references(parse_grader(data, "grader"), "grader")
    except GraderInvalid as exc:
        raise BadInput(f"{path}: {exc.param}: {exc.message}") from exc
    return data


def read_sample(args: argparse.Namespace) -> str:
    """The model sample: `--sample-text`, or the text of `--sample FILE` (one final newline dropped)."""
    if args.sample_text is not None:
        return str(args.sample_text)
    p = Path(args.sample)
    if not p.is_file():
        raise BadInput(f"no such sample file: {p}")
    text = p.read_text(encoding="utf-8")
    return text.removesuffix("\n")


class _Validated(BaseModel):
    """The API's answer to a validation: the grader as the deployment accepted it."""
    model_config = ConfigDict(extra="ignore")
    grader: Grader


def describe_validated(grader: AnyGrader) -> str:
    lines = [f"valid: {grader.name} ({grader.type})"]
    if isinstance(grader, MultiGrader):
        lines += [f"  {name:<20} {sub.type}" for name, sub in grader.graders.items()]
        lines.append(f"  reward = {grader.calculate_output}")
    fields = sorted({".".join(ref.path) for _, ref in references(grader, "grader") if ref.namespace == "item"})
    lines.append("  reads item fields: " + (", ".join(fields) if fields else "none"))
    return "\n".join(lines)


def describe_run(result: RunResult) -> str:
    m = result.metadata
    lines = [f"reward {result.reward:.4f}  ({m.name}, {m.type}, {m.execution_time * 1000:.1f} ms)"]
    for name, value in result.sub_rewards.items():
        lines.append(f"  {name:<20} {value:.4f}")
    flags = {k: v for k, v in m.errors.model_dump().items() if v not in (False, None)}
    for key, value in flags.items():
        if key.endswith(("_details", "_type")):
            continue
        detail = flags.get(f"{key}_details") or flags.get(key.replace("_error", "_error_type"))
        lines.append(f"  error {key}" + (f": {detail}" if detail else ""))
    return "\n".join(lines)


def cmd_graders(args: argparse.Namespace) -> int:
    grader = read_grader(args.grader)
    with Api() as api:
        if args.action == "validate":
            raw = api.post("/fine_tuning/alpha/graders/validate", {"grader": grader})
            print_result(args, raw, describe_validated(_Validated.model_validate(raw).grader))
            return 0
        item = read_json_file(args.item, "item") if args.item else {}
        raw = api.post("/fine_tuning/alpha/graders/run",
                       {"grader": grader, "model_sample": read_sample(args), "item": item})
        result = RunResult.model_validate(raw)
        print_result(args, raw, describe_run(result))
        return 1 if any(v is True for v in result.metadata.errors.model_dump().values()) else 0


def add_parser(sub, cmd) -> Any:
    graders = sub.add_parser("graders", help="reinforcement fine-tuning graders: validate, run on one sample",
                             description="Try a grader (OpenAI's grader object, as a JSON file) before a "
                                         "reinforcement job spends GPU time on it.")
    acts = graders.add_subparsers(dest="action", required=True, metavar="ACTION")
    cmd(acts, "validate", cmd_graders, "check a grader file against this deployment (fields, templates, "
                                       "judge models, sandbox)").add_argument("grader", help="grader JSON file")
    run = cmd(acts, "run", cmd_graders, "grade one model sample with a grader file: the reward, sub-rewards and "
                                        "errors (exit 1 when the grader erred)")
    run.add_argument("grader", help="grader JSON file")
    given = run.add_mutually_exclusive_group(required=True)
    given.add_argument("--sample", metavar="FILE", help="a file whose text is the model's output "
                                                        "({{sample.output_text}}; JSON text also fills output_json)")
    given.add_argument("--sample-text", metavar="TEXT", help="the model's output given inline")
    run.add_argument("--item", metavar="FILE", help="a JSON file: the dataset row the grader reads as {{item.x}}")
    return graders
