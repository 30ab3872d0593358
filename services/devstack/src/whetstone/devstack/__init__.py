"""The embedded development stack (Kafka, PostgreSQL, S3 as local processes) and the pytest plugin."""
