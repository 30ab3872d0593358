"""Pure parts of the graders: formula parser, templates, metrics, parsing and validation, and the
graders that need no process or endpoint (string_check, text_similarity, multi over them)."""

from __future__ import annotations

import asyncio

import pytest

from whetstone.graders import (
    GraderEnvironment,
    GraderInvalid,
    GraderSettings,
    MissingField,
    item_fields,
    parse_grader,
    run_grader,
    validate,
)
from whetstone.graders import formula, similarity
from whetstone.graders.templates import Sample, render

pytestmark = pytest.mark.unit


# -- formula ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("a + b * 2", 0.5 + 0.25 * 2), ("(a + b) / 2", 0.375), ("-a + abs(-b)", -0.25), ("min(a, b, 1)", 0.25),
    ("max(a, b) - 0.5", 0.0), ("2 ^ 3", 8.0), ("1e-1 * a", 0.05), ("floor(a * 3) + ceil(b)", 2.0),
])
def test_formula_values(text, value):
    assert formula.evaluate(formula.parse(text, {"a", "b"}), {"a": 0.5, "b": 0.25}) == pytest.approx(value)


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os').system('id')", "unexpected character"),
    ("__import__(a)", "'__import__' at position 0 is not a function"),
    ("__import__", "'__import__' at position 0 is not one of the graders"),
    ("a + c", "'c' at position 4 is not one of the graders"),
    ("a.__class__", "unexpected character '.'"),
    ("open(a)", "'open' at position 0 is not a function"),
    ("a +", "unexpected end of formula"),
    ("(a", "expected ')'"),
    ("a b", "unexpected 'b' at position 2"),
    ("'a'", "unexpected character"),
    ("", "empty"),
    ("abs(a, b)", "takes 1 argument"),
    ("(" * 100 + "a" + ")" * 100, "nests deeper"),
])
def test_formula_refusals_name_the_problem(text, fragment):
    with pytest.raises(formula.FormulaError) as caught:
        formula.parse(text, {"a", "b"})
    assert fragment in str(caught.value)


def test_formula_division_by_zero_is_an_evaluation_error():
    tree = formula.parse("a / b", {"a", "b"})
    with pytest.raises(formula.EvaluationError):
        formula.evaluate(tree, {"a": 1.0, "b": 0.0})
    with pytest.raises(formula.EvaluationError):
        formula.evaluate(formula.parse("10 ^ 1000", set()), {})


# -- templates -------------------------------------------------------------------------------------
def test_templates_resolve_item_paths_and_sample():
    sample = Sample.of('{"answer": {"n": 4}, "tags": ["x"]}')
    item = {"q": {"gold": "4"}, "list": [1, {"k": "v"}]}
    assert render("{{item.q.gold}}|{{ sample.output_json.answer.n }}|{{item.list.1.k}}|{{item.q}}", sample, item,
                  "input") == '4|4|v|{"gold":"4"}'
    assert render("{{sample.output_text}}", Sample.of("plain"), {}, "input") == "plain"


def test_templates_missing_item_field_names_it():
    with pytest.raises(MissingField) as caught:
        render("{{item.q.nope}}", Sample.of("x"), {"q": {}}, "reference")
    assert "reference" in str(caught.value) and "item.q.nope" in str(caught.value)


@pytest.mark.parametrize("template", ["{{env.HOME}}", "{{sample.choices}}", "{{item}}", "{{item.a[0]}}",
                                      "{{ __import__ }}"])
def test_templates_refuse_other_namespaces(template):
    grader = parse_grader({"type": "string_check", "name": "s", "input": template, "reference": "x",
                           "operation": "eq"})
    with pytest.raises(GraderInvalid) as caught:
        validate(grader, GraderSettings(), None)
    assert caught.value.param == "grader.input"


# -- metrics ---------------------------------------------------------------------------------------
def test_lcs_bit_parallel_matches_dynamic_programming():
    import random
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        b = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(len(a)):
            for j in range(len(b)):
                table[i + 1][j + 1] = table[i][j] + 1 if a[i] == b[j] else max(table[i][j + 1], table[i + 1][j])
        assert similarity.lcs_length(a, b) == table[-1][-1]


def test_metrics_identical_and_disjoint():
    for name, metric in similarity.LEXICAL.items():
        assert metric("the cat sat on the mat today", "the cat sat on the mat today") >= 0.99, name  # meteor's
        assert metric("aaa/bbb", "ccc ddd") == 0.0, name                                  # chunk penalty > 0


# expected values computed with rouge_score 0.1.2 (RougeScorer rouge1/2/3/L f-measure) and nltk 3.10
# (sentence_gleu); written out because importing those packages takes seconds
@pytest.mark.parametrize("text, reference, expected", [
    ("The quick brown fox jumps over the lazy dog", "A quick brown dog jumps over the lazy fox",
     (0.8888888889, 0.5, 0.2857142857, 0.6666666667)),
    ("police killed the gunman", "the gunman was killed by police", (0.8, 0.25, 0.0, 0.4)),
    ("a b c d", "a c b d e", (0.8888888889, 0.0, 0.0, 0.6666666667))])
def test_rouge_agrees_with_rouge_score(text, reference, expected):
    got = (*(similarity.rouge_n(text, reference, n) for n in (1, 2, 3)), similarity.rouge_l(text, reference))
    assert got == pytest.approx(expected, abs=1e-9)


def test_gleu_agrees_with_nltk():
    assert similarity.gleu("the cat is on the mat", "there is a cat on the mat") == pytest.approx(0.36363636363636365)


def test_bleu_and_meteor_order_sensibly():
    ref = "the cat is sitting on the mat"
    assert similarity.bleu("the cat is sitting on the mat", ref) == pytest.approx(1.0)
    close, far = similarity.bleu("the cat sat on the mat", ref), similarity.bleu("mat the on cat the", ref)
    assert 0 < far < close < 1
    assert similarity.meteor("the cat sat on the mat", ref) > similarity.meteor("mat the on cat the", ref)
    assert similarity.fuzzy_match("kitten", "sitting") == pytest.approx(2 * 4 / 13)


# -- parsing and validation ------------------------------------------------------------------------
def test_unknown_and_wrong_fields_are_named():
    with pytest.raises(GraderInvalid) as caught:
        parse_grader({"type": "string_check", "name": "s", "input": "x", "reference": "y", "operation": "eq",
                      "bogus": 1})
    assert caught.value.param == "grader.bogus" and "unknown field" in caught.value.message
    with pytest.raises(GraderInvalid) as caught:
        parse_grader({"type": "string_check", "name": "s", "input": "x", "reference": "y", "operation": "regex"})
    assert caught.value.param == "grader.operation"
    with pytest.raises(GraderInvalid) as caught:
        parse_grader({"type": "multi", "name": "m", "calculate_output": "a", "graders": {
            "a": {"type": "string_check", "name": "a", "input": "x", "reference": "y", "operation": "eq", "z": 1}}})
    assert caught.value.param == "grader.graders.a.z"
    with pytest.raises(GraderInvalid) as caught:
        parse_grader({"type": "label_model", "name": "l", "model": "m", "input": [], "labels": ["a"],
                      "passing_labels": ["a"]})
    assert "only inside a multi grader" in caught.value.message


def test_validation_refuses_unconfigured_judge_cosine_and_bad_formula():
    settings = GraderSettings(judges={})
    judge = parse_grader({"type": "score_model", "name": "j", "model": "gpt-4o",
                          "input": [{"role": "user", "content": "Rate {{sample.output_text}}"}]})
    with pytest.raises(GraderInvalid) as caught:
        validate(judge, settings, None)
    assert caught.value.param == "grader.model" and caught.value.code == "model_not_configured"
    cosine = parse_grader({"type": "text_similarity", "name": "c", "input": "{{sample.output_text}}",
                           "reference": "x", "evaluation_metric": "cosine"})
    with pytest.raises(GraderInvalid) as caught:
        validate(cosine, settings, None)
    assert caught.value.code == "metric_not_available"
    bad = parse_grader({"type": "multi", "name": "m", "calculate_output": "a + __import__(a)", "graders": {
        "a": {"type": "string_check", "name": "a", "input": "x", "reference": "y", "operation": "eq"}}})
    with pytest.raises(GraderInvalid) as caught:
        validate(bad, settings, None)
    assert caught.value.param == "grader.calculate_output" and "__import__" in caught.value.message
    source = parse_grader({"type": "python", "name": "p", "source": "def grade(sample):\n    return 1"})
    with pytest.raises(GraderInvalid) as caught:
        validate(source, settings, None)
    assert caught.value.param == "grader.source"


def test_item_fields_lists_every_referenced_path():
    grader = parse_grader({"type": "multi", "name": "m", "calculate_output": "a * b", "graders": {
        "a": {"type": "string_check", "name": "a", "input": "{{sample.output_text}}", "reference": "{{item.gold}}",
              "operation": "eq"},
        "b": {"type": "text_similarity", "name": "b", "input": "{{sample.output_json.x}}",
              "reference": "{{item.meta.ref}}", "evaluation_metric": "rouge_l"}}})
    assert item_fields(grader) == [("gold",), ("meta", "ref")]


# -- running the in-process graders ----------------------------------------------------------------
def run(grader: dict, sample: str, item: dict, **kw):
    env = GraderEnvironment(GraderSettings())
    return asyncio.run(run_grader(parse_grader(grader), sample, item, env, **kw))


@pytest.mark.parametrize("operation, sample, reward", [
    ("eq", "Paris", 1.0), ("eq", "paris", 0.0), ("ne", "Rome", 1.0), ("like", "It is Paris.", 1.0),
    ("like", "it is paris", 0.0), ("ilike", "it is PARIS", 1.0)])
def test_string_check_operations(operation, sample, reward):
    result = run({"type": "string_check", "name": "s", "input": "{{sample.output_text}}",
                  "reference": "{{item.city}}", "operation": operation}, sample, {"city": "Paris"})
    assert result.reward == reward and not result.metadata.errors.any()


def test_multi_combines_sub_rewards_by_formula():
    grader = {"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * similar", "graders": {
        "exact": {"type": "string_check", "name": "exact", "input": "{{sample.output_json.city}}",
                  "reference": "{{item.city}}", "operation": "eq"},
        "similar": {"type": "text_similarity", "name": "similar", "input": "{{sample.output_json.why}}",
                    "reference": "{{item.why}}", "evaluation_metric": "rouge_1"}}}
    result = run(grader, '{"city": "Paris", "why": "capital of France"}', {"city": "Paris", "why": "capital of France"})
    assert result.reward == pytest.approx(1.0)
    assert result.sub_rewards == {"exact": 1.0, "similar": 1.0}
    assert result.metadata.type == "multi" and result.metadata.name == "m"
    not_json = run(grader, "Paris", {"city": "Paris", "why": "x"})
    assert not_json.reward == 0.0 and not_json.metadata.errors.sample_parse_error


def test_missing_item_field_is_strict_for_run_and_a_flag_in_training():
    grader = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "{{item.gold}}",
              "operation": "eq"}
    with pytest.raises(MissingField):
        run(grader, "x", {"other": 1}, strict_item=True)
    flagged = run(grader, "x", {"other": 1})
    assert flagged.reward == 0.0 and flagged.metadata.errors.invalid_variable_error
