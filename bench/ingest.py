"""Ingest benchmark: the full data gate on synthetic chat data with planted problems, against
straightforward baselines measured in the same run.

1. generate a 10,000-item reference set (benchmark-style question + answer) and N chat
   examples of about 300 words (default 100,000; --quick 10,000) with planted problems:
   exact duplicates (2%, some differing only in case/whitespace), near-duplicates (3%,
   word substitutions giving an exact char-5-gram Jaccard in 0.87-0.99 with their source),
   contaminated examples (1%, a reference question + answer), hard negatives (1%, a
   reference question inside an otherwise original conversation: under 50% overlap) and
   PII (0.5%); the file is written and read as a stream;
2. run the whole gate (`DataGate`, exactly what the service and `whet datasets check` run)
   on the JSONL file with `--workers` processes (default: WHETSTONE_INGEST_WORKERS, else 2), then again with
   parallelism off: the train/validation/audit files must be byte-identical and the reports
   equal; end-to-end examples/s, examples per CPU-second (worker processes included) and
   peak RSS (the gate's process and the largest worker) of both;
3. score near-duplicate removal and contamination flags from the gate's audit trail
   against the planted truth (asserted: every planted exact/near duplicate and contaminated
   row found, no false positive); precision is checked independently with Python sets of
   5-gram strings (a removed row must really have Jaccard >= 0.9 with its partner);
4. MinHash against the strongest baselines on the same documents (5,000 / 10,000 of the
   examples, exact duplicates removed), 128 permutations, the same LSH banding: ours
   (batched one-permutation MinHash + band hashes), rensa (`RMinHash.from_token_sets`, Rust;
   also from pre-split shingles) and datasketch's bulk path (`MinHash.bulk` -> `LeanMinHash`
   -> `MinHashLSH`): docs/s and the recall / precision of each LSH's candidate pairs against
   the pairs whose exact Jaccard is >= 0.9; a plain Python 13-gram set scan (regex words, set
   of tuples) vs the gate's hashed 13-grams. Timed rounds alternate (3 rounds, best of each;
   datasketch, ~100x slower, one round).

    .venv/bin/python bench/ingest.py [--examples N] [--quick] [--seed S] [--keep DIR]

Throughputs are wall-clock, on a machine that may be shared: the JSON also gives the
gate's examples per CPU-second and the 1-minute load average before and after the run.
The default (100,000 examples, ~210 MB) takes about 1.5 to 3 minutes on 2 cores.

Last line: JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from minhash_baselines import (  # bench/ sibling module
    ROUNDS,
    THRESHOLD,
    bench_minhash,
    best_rate,
    shingle_jaccard,
    timed,
)
from whetstone.ingest.adapters.formats import open_source
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.domain.contamination import ReferenceIndex
from whetstone.ingest.domain.schemas import canonical_text
from whetstone.ingest.domain.text import normalize_text
from whetstone.ingest.usecases.gates import (
    GateRequest,
    make_gate,
    reference_index,
    toxicity_classifier,
)

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a concise expert. Answer precisely.",
                  "You are a friendly tutor who explains things step by step.",
                  "Answer as a careful analyst and state your assumptions."]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """CPU time of this process (the gate's worker processes report theirs in the gate's timings)."""
    t = os.times()
    return t.user + t.system


def file_digest(path: Path | None) -> str | None:
    return hashlib.file_digest(open(path, "rb"), "sha256").hexdigest() if path else None


def run_gate(data: Path, ref: Path, work: Path, name: str, workers: int):
    """The whole gate as the service runs it (reference index build included): (result, wall s, CPU s)."""
    settings = IngestSettings(max_examples=10**9, max_examples_by_tier={}, workers=workers)
    cpu, t = cpu_seconds(), time.perf_counter()
    references = reference_index(settings, [ref.parent])
    gate = make_gate(settings, GateRequest(purpose="sft"), tokenizer=None, references=references,
                     toxicity=toxicity_classifier(settings))
    result = gate.run(open_source(data, workdir=work / f"{name}-src"), work / name)
    workers_cpu = result.report.timings.get("workers_cpu_s", 0.0)
    return result, time.perf_counter() - t, cpu_seconds() - cpu + workers_cpu


class Words:
    """A Zipf-distributed vocabulary of synthetic words."""

    def __init__(self, rng: random.Random, size: int = 30_000) -> None:
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.rng = rng
        self.vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(size)]
        self.cum = list(itertools.accumulate(1.0 / (r + 10) for r in range(size)))

    def text(self, n: int) -> str:
        return " ".join(self.rng.choices(self.vocab, cum_weights=self.cum, k=n))

    def sentence_text(self, n: int) -> str:
        words = self.rng.choices(self.vocab, cum_weights=self.cum, k=n)
        for i in range(0, n, self.rng.randint(8, 16)):
            words[i] = words[i].capitalize()
        return " ".join(words) + "."


def jaccard(a: str, b: str) -> float:
    """Exact Jaccard of the gate's shingles (char 5-grams of the normalized text)."""
    return shingle_jaccard(normalize_text(a), normalize_text(b))


def row_text(row: dict) -> str:
    return canonical_text({"messages": row["messages"]})


def make_reference(words: Words, n: int) -> list[dict]:
    return [{"question": words.sentence_text(words.rng.randint(50, 90)),
             "answer": words.sentence_text(words.rng.randint(10, 30))} for _ in range(n)]


def base_example(words: Words) -> dict:
    rng = words.rng
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.3 else []
    messages += [{"role": "user", "content": words.sentence_text(rng.randint(45, 70))},
                 {"role": "assistant", "content": words.sentence_text(rng.randint(220, 260))}]
    return {"messages": messages}


def near_variant(words: Words, source: dict, target: float) -> tuple[dict, float] | None:
    """Substitute words of the assistant turn until the Jaccard with the source is near `target`."""
    rng = words.rng
    src_text = row_text(source)
    k = max(1, round((1 - target) / 0.0065))
    for _ in range(4):
        answer = source["messages"][-1]["content"].split(" ")
        for pos in rng.sample(range(len(answer)), min(k, len(answer))):
            answer[pos] = rng.choice(words.vocab)
        variant = {"messages": [*source["messages"][:-1], {"role": "assistant", "content": " ".join(answer)}]}
        j = jaccard(src_text, row_text(variant))
        if 0.87 <= j <= 0.99:
            return variant, j
        k = max(1, round(k * (1 - target) / max(1e-6, 1 - j)))
    return None


def generate(path: Path, ref_path: Path, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    words = Words(rng)
    reference = make_reference(words, 10_000)
    with open(ref_path, "w") as f:
        for item in reference:
            f.write(json.dumps(item) + "\n")
    truth = {"exact": [], "near": [], "contaminated": [], "hard_negative": [], "pii": []}
    unused_items = list(range(len(reference)))
    rng.shuffle(unused_items)              # each reference item is planted at most once
    recent: list[tuple[int, dict]] = []
    used_for_near: set[int] = set()
    with open(path, "w") as f:
        for line in range(1, n + 1):
            roll = rng.random()
            row = None
            if roll < 0.02 and recent:
                src_line, src = rng.choice(recent)
                row = json.loads(json.dumps(src))
                if rng.random() < 0.5:
                    row["messages"][-1]["content"] = "  " + row["messages"][-1]["content"].upper() + " "
                truth["exact"].append(line)
            elif roll < 0.05 and recent:
                src_line, src = rng.choice(recent)
                if src_line not in used_for_near:
                    got = near_variant(words, src, rng.uniform(0.87, 0.99))
                    if got:
                        row, j = got
                        used_for_near.add(src_line)
                        truth["near"].append((line, src_line, j))
            elif roll < 0.06 and unused_items:
                item = reference[unused_items.pop()]
                row = {"messages": [{"role": "user", "content": "Answer this question: " + item["question"]},
                                    {"role": "assistant", "content": item["answer"]}]}
                truth["contaminated"].append(line)
            elif roll < 0.07 and unused_items:
                item = reference[unused_items.pop()]
                row = {"messages": [{"role": "user", "content": item["question"] + " " + words.sentence_text(20)},
                                    {"role": "assistant", "content": words.sentence_text(230)}]}
                truth["hard_negative"].append(line)
            elif roll < 0.075:
                row = base_example(words)
                row["messages"][-1]["content"] += f" Write to user{line}@example.com or call +1 415 555 {1000 + line % 9000}."
                truth["pii"].append(line)
            if row is None:
                row = base_example(words)
                if len(recent) < 5000:
                    recent.append((line, row))
                else:
                    recent[rng.randrange(5000)] = (line, row)
            f.write(json.dumps(row) + "\n")
    return truth


def read_lines(path: Path, wanted: set[int]) -> dict[int, dict]:
    found = {}
    with open(path) as f:
        for i, line in enumerate(f, start=1):
            if i in wanted:
                found[i] = json.loads(line)
    return found


def sample_texts(path: Path, n: int) -> list[str]:
    with open(path) as f:
        return [canonical_text(json.loads(line)) for line in itertools.islice(f, n)]


_WORD = re.compile(r"\w+")


def _grams(text: str) -> list[tuple[str, ...]]:
    w = _WORD.findall(text.lower())
    return [tuple(w[i:i + 13]) for i in range(len(w) - 12)]


def bench_contamination(texts: list[str], ref_path: Path, baseline_n: int) -> dict:
    items = [" ".join(json.loads(line).values()) for line in open(ref_path)]
    t = time.perf_counter()
    index = ReferenceIndex()
    index.add("reference", items)
    ours_build = time.perf_counter() - t
    t = time.perf_counter()
    ref_grams = set()
    for item in items:
        ref_grams.update(_grams(item))
    base_build = time.perf_counter() - t
    ours_flags: list[bool] = []
    base_flags: list[bool] = []

    def ours() -> None:
        ours_flags.clear()
        for i in range(0, len(texts), 512):
            fractions, _ = index.match(texts[i:i + 512])
            ours_flags.extend((fractions > 0.5).tolist())

    def baseline() -> None:
        base_flags.clear()
        for text in texts[:baseline_n]:
            grams = _grams(text)
            base_flags.append(bool(grams) and sum(g in ref_grams for g in grams) / len(grams) > 0.5)

    runs = [(timed(ours, len(texts)), timed(baseline, baseline_n)) for _ in range(ROUNDS)]
    rate, base = best_rate([r[0] for r in runs]), best_rate([r[1] for r in runs])
    agree = sum(a == b for a, b in zip(ours_flags, base_flags)) / baseline_n
    return {"contamination_docs_per_s": round(rate, 1), "contamination_baseline_docs_per_s": round(base, 1),
            "contamination_speedup": round(rate / base, 1), "contamination_index_build_s": round(ours_build, 2),
            "contamination_baseline_build_s": round(base_build, 2), "contamination_baseline_agreement": agree,
            "contamination_index_mb": round(index.nbytes / 2**20, 1)}


def score(audit_path: Path, data: Path, truth: dict) -> dict:
    removed_near: dict[int, dict] = {}
    flagged_contaminated: set[int] = set()
    exact_removed: set[int] = set()
    for line in open(audit_path):
        a = json.loads(line)
        if a["reason"] == "near_duplicate" and a["action"] == "removed":
            removed_near[a["line"]] = a
        elif a["reason"] == "contamination":
            flagged_contaminated.add(a["line"])
        elif a["reason"] == "exact_duplicate":
            exact_removed.add(a["line"])
    positives = {line for line, _, j in truth["near"] if j >= THRESHOLD}
    below = {line for line, _, j in truth["near"] if j < THRESHOLD}
    rows = read_lines(data, set(removed_near) | {a["duplicate_of"] for a in removed_near.values()})
    correct = sum(1 for line, a in removed_near.items()
                  if jaccard(row_text(rows[line]), row_text(rows[a["duplicate_of"]])) >= THRESHOLD)
    planted_contaminated = set(truth["contaminated"])
    return {
        "near_dup_recall": round(len(positives & set(removed_near)) / max(1, len(positives)), 4),
        "near_dup_precision": round(correct / max(1, len(removed_near)), 4),
        "near_dup_planted": len(truth["near"]), "near_dup_planted_above_threshold": len(positives),
        "near_dup_below_threshold_kept": len(below - set(removed_near)), "near_dup_below_threshold": len(below),
        "near_dup_removed": len(removed_near),
        "exact_dup_planted": len(truth["exact"]), "exact_dup_recall": round(
            len(set(truth["exact"]) & exact_removed) / max(1, len(truth["exact"])), 4),
        "contamination_recall": round(len(planted_contaminated & flagged_contaminated)
                                      / max(1, len(planted_contaminated)), 4),
        "contamination_false_positives": len(flagged_contaminated - planted_contaminated),
        "contamination_planted": len(planted_contaminated), "hard_negatives_planted": len(truth["hard_negative"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int)
    ap.add_argument("--quick", action="store_true", help="10,000 examples and smaller baseline samples")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", help="keep the generated data in this directory")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WHETSTONE_INGEST_WORKERS", "2")),
                    help="processes for the gate's pooled run (default: WHETSTONE_INGEST_WORKERS, else 2: both "
                         "cores); the serial run beside it is the baseline")
    ap.add_argument("--expect-sha256", help="the outputs' digest (`outputs_sha256` of an earlier run, e.g. of the "
                                            "code before a speed-up, same --examples/--seed): asserted equal")
    args = ap.parse_args(argv)
    n = args.examples or (10_000 if args.quick else 100_000)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    data, ref = work / "train.jsonl", work / "reference" / "benchmark.jsonl"
    ref.parent.mkdir(exist_ok=True)
    t = time.perf_counter()
    truth = generate(data, ref, n, args.seed)
    gen_s = time.perf_counter() - t
    size_mb = data.stat().st_size / 2**20
    print(f"generated {n} examples ({size_mb:.0f} MB) + 10,000 reference items in {gen_s:.1f}s", file=sys.stderr)

    workers = max(1, args.workers)
    load_before = os.getloadavg()[0]
    result, e2e_s, e2e_cpu_s = run_gate(data, ref, work, "gate", workers)
    r = result.report.as_dict()
    rss_pipeline, rss_workers = peak_rss_mb(), r["timings"].get("workers_peak_rss_mb", 0.0)
    print(f"gate ({workers} workers): {r['status']}, {r['rows_kept']}/{r['rows_total']} kept, {r['exact_duplicates']} "
          f"exact, {r['near_duplicates']} near, {r['contaminated']} contaminated, {r['pii_hits']} PII hits in "
          f"{e2e_s:.1f}s ({n / e2e_s:.0f} examples/s, {n / e2e_cpu_s:.0f} per CPU-second; timings {r['timings']}); "
          f"peak RSS {rss_pipeline:.0f} MB (workers {rss_workers:.0f} MB)", file=sys.stderr)
    scores = score(result.audit_path, data, truth)
    print(f"scores: {scores}", file=sys.stderr)
    # the same gate with parallelism off: the written files must be byte-identical
    serial, serial_s, serial_cpu_s = run_gate(data, ref, work, "gate-serial", 1)
    rs = serial.report.as_dict()
    identical = all(file_digest(a) == file_digest(b) for a, b in (
        (result.train_path, serial.train_path), (result.validation_path, serial.validation_path),
        (result.audit_path, serial.audit_path)))
    print(f"serial gate: {n / serial_s:.0f} examples/s, {n / serial_cpu_s:.0f} per CPU-second; files identical to "
          f"the {workers}-worker run: {identical}", file=sys.stderr)
    assert identical, "the pooled gate wrote different files than the serial one"
    outputs_sha256 = hashlib.sha256("|".join(str(file_digest(p)) for p in (
        result.train_path, result.validation_path, result.audit_path)).encode()).hexdigest()
    assert not args.expect_sha256 or outputs_sha256 == args.expect_sha256, \
        f"outputs {outputs_sha256} differ from the expected {args.expect_sha256}"
    assert {k: v for k, v in rs.items() if k != "timings"} == {k: v for k, v in r.items() if k != "timings"}
    # the planted figures
    assert r["accepted"] and scores["exact_dup_recall"] == 1.0, scores
    assert scores["near_dup_recall"] == 1.0 and scores["near_dup_precision"] == 1.0, scores
    assert scores["near_dup_below_threshold_kept"] == scores["near_dup_below_threshold"], scores
    assert scores["contamination_recall"] == 1.0 and scores["contamination_false_positives"] == 0, scores
    assert r["exact_duplicates"] == scores["exact_dup_planted"] and r["pii_hits"] == 2 * len(truth["pii"]), r

    sample = sample_texts(data, 5_000 if args.quick else 20_000)
    mh = bench_minhash(sample[:5_000 if args.quick else 10_000], [(src - 1, line - 1) for line, src, _ in truth["near"]])
    print(f"minhash: {mh}", file=sys.stderr)
    ct = bench_contamination(sample, ref, 2_000 if args.quick else 5_000)
    print(f"contamination: {ct}", file=sys.stderr)

    out = {"examples": n, "workers": workers, "end_to_end_examples_per_s": round(n / e2e_s, 1), **mh,
           "near_dup_recall": scores["near_dup_recall"], "near_dup_precision": scores["near_dup_precision"],
           **ct, "contamination_recall": scores["contamination_recall"],
           "contamination_false_positives": scores["contamination_false_positives"],
           "peak_rss_mb": round(rss_pipeline, 1), "worker_peak_rss_mb": round(rss_workers, 1),
           "peak_rss_mb_with_baselines": round(peak_rss_mb(), 1),
           "input_mb": round(size_mb, 1), "end_to_end_s": round(e2e_s, 2),
           "end_to_end_examples_per_cpu_s": round(n / e2e_cpu_s, 1),
           "serial_examples_per_s": round(n / serial_s, 1), "serial_examples_per_cpu_s": round(n / serial_cpu_s, 1),
           "serial_files_identical": identical, "outputs_sha256": outputs_sha256,
           "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "gate_timings": r["timings"],
           "accepted": r["accepted"], "rows_kept": r["rows_kept"], "exact_duplicates": r["exact_duplicates"],
           "near_duplicates": r["near_duplicates"], "contaminated": r["contaminated"], "pii_hits": r["pii_hits"],
           "candidate_pairs": r["near_dup"]["candidate_pairs"],
           **{k: v for k, v in scores.items() if k not in ("near_dup_recall", "near_dup_precision",
                                                           "contamination_recall", "contamination_false_positives")}}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
