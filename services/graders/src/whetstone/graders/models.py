"""Graders as OpenAI's API defines them (field names as in the `openai` package's `types/graders`).

Every model forbids unknown fields, so a misspelt field is refused with its name. `Grader` is what a
fine-tuning job or `/graders/run` accepts at the top level (string_check, text_similarity, python,
score_model, multi); `label_model` is accepted only inside `multi`, as in OpenAI's API.

`multi.graders` is a mapping of name -> grader (what `calculate_output` refers to); a single grader
object (the SDK's type allows it) is accepted as the mapping {its name: it}.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TEXT_METRICS = ("cosine", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4",
                "rouge_5", "rouge_l")
MAX_SOURCE_BYTES = 256 * 1024
MAX_TEMPLATE_CHARS = 64 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StringCheckGrader(Strict):
    type: Literal["string_check"]
    name: str = Field(min_length=1, max_length=256)
    input: str = Field(max_length=MAX_TEMPLATE_CHARS)
    reference: str = Field(max_length=MAX_TEMPLATE_CHARS)
    operation: Literal["eq", "ne", "like", "ilike"]


class TextSimilarityGrader(Strict):
    type: Literal["text_similarity"]
    name: str = Field(min_length=1, max_length=256)
    input: str = Field(max_length=MAX_TEMPLATE_CHARS)
    reference: str = Field(max_length=MAX_TEMPLATE_CHARS)
    evaluation_metric: Literal["cosine", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3",
                               "rouge_4", "rouge_5", "rouge_l"]


class PythonGrader(Strict):
    type: Literal["python"]
    name: str = Field(min_length=1, max_length=256)
    source: str = Field(min_length=1)
    image_tag: str | None = None   # accepted for compatibility; one interpreter image is offered

    @field_validator("source")
    @classmethod
    def bounded(cls, value: str) -> str:
        if len(value.encode()) > MAX_SOURCE_BYTES:
            raise ValueError(f"source is over {MAX_SOURCE_BYTES // 1024} KiB")
        return value


class TextPart(Strict):
    type: Literal["input_text", "output_text"]
    text: str = Field(max_length=MAX_TEMPLATE_CHARS)


class ImagePart(Strict):
    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(Strict):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | ContentPart | list[ContentPart]
    type: Literal["message"] | None = None

    def parts(self) -> list[TextPart | ImagePart]:
        if isinstance(self.content, str):
            return [TextPart(type="input_text", text=self.content)]
        return self.content if isinstance(self.content, list) else [self.content]


class SamplingParams(Strict):
    max_completions_tokens: int | None = Field(default=None, ge=1, le=32768)
    reasoning_effort: str | None = None
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)


class ScoreModelGrader(Strict):
    type: Literal["score_model"]
    name: str = Field(min_length=1, max_length=256)
    model: str = Field(min_length=1)
    input: list[Message] = Field(min_length=1)
    range: list[float] | None = None
    sampling_params: SamplingParams | None = None

    @field_validator("range")
    @classmethod
    def two_numbers(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or value[0] >= value[1]):
            raise ValueError("range must be two numbers [min, max] with min < max")
        return value

    def bounds(self) -> tuple[float, float]:
        return (self.range[0], self.range[1]) if self.range else (0.0, 1.0)


class LabelModelGrader(Strict):
    type: Literal["label_model"]
    name: str = Field(min_length=1, max_length=256)
    model: str = Field(min_length=1)
    input: list[Message] = Field(min_length=1)
    labels: list[str] = Field(min_length=1)
    passing_labels: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def passing_within_labels(self) -> LabelModelGrader:
        extra = [x for x in self.passing_labels if x not in self.labels]
        if extra:
            raise ValueError(f"passing_labels must be a subset of labels; not in labels: {extra}")
        return self


TextGrader = StringCheckGrader | TextSimilarityGrader   # compares its input template with its reference template
JudgeGrader = ScoreModelGrader | LabelModelGrader       # asks a judge model, over templated messages
SubGrader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader,
                      Field(discriminator="type")]


class MultiGrader(Strict):
    type: Literal["multi"]
    name: str = Field(min_length=1, max_length=256)
    graders: dict[str, SubGrader] = Field(min_length=1, max_length=32)
    calculate_output: str = Field(min_length=1, max_length=4096)

    @model_validator(mode="before")
    @classmethod
    def one_grader_as_mapping(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("graders"), dict) and "type" in data["graders"] \
                and isinstance(data["graders"].get("type"), str):
            one = data["graders"]
            return {**data, "graders": {str(one.get("name") or "grader"): one}}
        return data


Grader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | MultiGrader,
                   Field(discriminator="type")]
AnyGrader = StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader | MultiGrader
