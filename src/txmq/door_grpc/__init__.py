"""The RocketMQ 5 gRPC front door (``apache.rocketmq.v2.MessagingService`` over h2c): turns RPCs into calls on the
broker's door-neutral services and their answers back into protobuf. Nothing below ``txmq.broker`` imports it."""
