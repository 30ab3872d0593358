"""Whetstone's wire contract: envelope, events, topic table."""

from .base import TOLERANT, Contract, Envelope, Event, utcnow
from .dataset_stats import *  # noqa: F403
from .enums import *  # noqa: F403
from .estimates import *  # noqa: F403
from .events import *  # noqa: F403
from .model_events import *  # noqa: F403
from .platform_events import *  # noqa: F403
from .naming import checkpoint_model_for, fine_tuned_model_for, parse_checkpoint_model, result_file_id_for
from .topics import DLQ_MODEL, EVENT_MODELS, TOPICS, Topic, all_topic_partitions, dataset_id_for, job_id_for, topic_for

__all__ = [
    "TOLERANT", "Contract", "Envelope", "Event", "utcnow",
    "DLQ_MODEL", "EVENT_MODELS", "TOPICS", "Topic", "all_topic_partitions", "dataset_id_for", "job_id_for", "topic_for",
    "checkpoint_model_for", "fine_tuned_model_for", "parse_checkpoint_model", "result_file_id_for",
]
