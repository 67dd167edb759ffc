package txmq.compat;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Request-reply (RocketMQ 4.6+): {@code request} sends --count messages with DefaultMQProducer.request and prints each
 * reply; {@code replier} consumes the topic and answers each message with MessageUtil.createReplyMessage, body
 * "re:" + the request's body.
 */
final class RequestReply {
    private RequestReply() {
    }

    static void request(Args a) throws Exception {
        DefaultMQProducer p = Produce.start(a);
        int count = a.integer("count", 1);
        long timeout = a.integer("reply-timeout", 10000);
        int failed = 0;
        try {
            for (int i = 0; i < count; i++) {
                Message m = Clients.message(a, i);
                long started = System.currentTimeMillis();
                try {
                    Message reply = p.request(m, timeout);
                    Out.event("reply", "i", i, "body", Out.body(reply.getBody()), "topic", reply.getTopic(),
                        "properties", reply.getProperties(), "ms", System.currentTimeMillis() - started);
                } catch (Exception e) {
                    failed++;
                    Clients.error("request " + i, e);
                }
            }
        } finally {
            p.shutdown();
        }
        Out.event("summary", "failed", failed);
    }

    static void replier(Args a) throws Exception {
        DefaultMQProducer p = Produce.start(a);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.need("group"), Clients.aclHook(a),
            new org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely());
        c.setNamesrvAddr(a.need("namesrv"));
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(a.need("topic"), "*");
        AtomicInteger replied = new AtomicInteger();
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                try {
                    byte[] body = ("re:" + Out.body(m.getBody())).getBytes(StandardCharsets.UTF_8);
                    Message reply = MessageUtil.createReplyMessage(m, body);
                    SendResult r = p.send(reply);
                    Out.event("replied", "body", Out.body(m.getBody()), "status", r.getSendStatus().name(),
                        "replyTopic", reply.getTopic());
                    replied.incrementAndGet();
                } catch (Exception e) {
                    Clients.error("reply to " + Out.body(m.getBody()), e);
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        Out.event("ready");
        int expect = a.integer("expect", 1);
        long deadline = System.currentTimeMillis() + a.integer("timeout", 60) * 1000L;
        while (replied.get() < expect && System.currentTimeMillis() < deadline) {
            Thread.sleep(50);
        }
        Out.event("summary", "replied", replied.get());
        c.shutdown();
        p.shutdown();
    }
}
