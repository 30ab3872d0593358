"""Whetstone's wire contract: envelope, events, topic table."""

from .base import TOLERANT, Contract, Envelope, Event, utcnow
from .events import *  # noqa: F403
from .topics import DLQ_MODEL, EVENT_MODELS, TOPICS, Topic, all_topic_partitions, dataset_id_for, job_id_for, topic_for

__all__ = [
    "TOLERANT", "Contract", "Envelope", "Event", "utcnow",
    "DLQ_MODEL", "EVENT_MODELS", "TOPICS", "Topic", "all_topic_partitions", "dataset_id_for", "job_id_for", "topic_for",
]
