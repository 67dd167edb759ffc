"""RocketMQ's wire and storage formats, with no IO: records, properties, message ids and (later) frames."""
