"""JSON as a dataset file holds it: the rows the layout checks read field by field, and the
normalised rows written back as JSON lines. Pure."""

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
