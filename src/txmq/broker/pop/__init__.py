"""Pop consumption (RocketMQ 5's receive / ack / change-invisible-duration): which messages of a queue a consumer
group holds, until when, and what happens when a hold expires. Door-neutral: the gRPC door calls it, and nothing
here knows a protobuf."""
