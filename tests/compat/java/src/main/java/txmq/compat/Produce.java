package txmq.compat;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/** DefaultMQProducer: sync, async, oneway, batch and orderly sends (--mode), one "sent" line per message. */
final class Produce {
    private Produce() {
    }

    static DefaultMQProducer start(Args a) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(a.get("group", "JavaCompatPG"), Clients.aclHook(a),
            a.flag("trace"), null);
        p.setNamesrvAddr(a.need("namesrv"));
        p.setSendMsgTimeout(a.integer("send-timeout", 5000));
        p.setRetryTimesWhenSendFailed(a.integer("retries", 2));
        if (a.get("max-message-size", null) != null) {
            p.setMaxMessageSize(a.integer("max-message-size", 0));
        }
        if (a.get("compress-over", null) != null) {
            p.setCompressMsgBodyOverHowmuch(a.integer("compress-over", 4096));
        }
        p.start();
        return p;
    }

    static void sent(int i, Message m, SendResult r) {
        Out.event("sent", "i", i, "body", Out.body(m.getBody()), "status", r.getSendStatus().name(),
            "msgId", r.getMsgId(), "offsetMsgId", r.getOffsetMsgId(), "queueId", r.getMessageQueue().getQueueId(),
            "queueOffset", r.getQueueOffset(), "broker", r.getMessageQueue().getBrokerName());
    }

    static void run(Args a) throws Exception {
        DefaultMQProducer p = start(a);
        int count = a.integer("count", 1);
        String mode = a.get("mode", "sync");
        AtomicInteger failed = new AtomicInteger();
        try {
            switch (mode) {
                case "sync":
                    for (int i = 0; i < count; i++) {
                        Message m = Clients.message(a, i);
                        try {
                            sent(i, m, p.send(m));
                        } catch (Exception e) {
                            failed.incrementAndGet();
                            Clients.error("send " + i, e);
                        }
                    }
                    break;
                case "async": {
                    CountDownLatch done = new CountDownLatch(count);
                    for (int i = 0; i < count; i++) {
                        final int n = i;
                        final Message m = Clients.message(a, i);
                        p.send(m, new SendCallback() {
                            @Override
                            public void onSuccess(SendResult r) {
                                sent(n, m, r);
                                done.countDown();
                            }

                            @Override
                            public void onException(Throwable e) {
                                failed.incrementAndGet();
                                Clients.error("send " + n, e);
                                done.countDown();
                            }
                        });
                    }
                    if (!done.await(60, TimeUnit.SECONDS)) {
                        Out.event("error", "what", "async sends did not all complete");
                    }
                    break;
                }
                case "oneway":
                    for (int i = 0; i < count; i++) {
                        Message m = Clients.message(a, i);
                        p.sendOneway(m);
                        Out.event("sent", "i", i, "body", Out.body(m.getBody()), "status", "ONEWAY");
                    }
                    break;
                case "batch": {
                    List<Message> batch = new ArrayList<>();
                    for (int i = 0; i < count; i++) {
                        batch.add(Clients.message(a, i));
                    }
                    SendResult r = p.send(batch);
                    String[] ids = r.getMsgId().split(",");
                    for (int i = 0; i < count; i++) {
                        Out.event("sent", "i", i, "body", Out.body(batch.get(i).getBody()),
                            "status", r.getSendStatus().name(), "msgId", ids[i],
                            "queueId", r.getMessageQueue().getQueueId(), "queueOffset", r.getQueueOffset() + i);
                    }
                    break;
                }
                case "orderly": {
                    // The classic orderly sample: an order id picks the queue, so one order's steps stay in order.
                    int orders = a.integer("orders", 4);
                    MessageQueueSelector selector = (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size());
                    for (int i = 0; i < count; i++) {
                        Message m = Clients.message(a, i);
                        int order = i % orders;
                        m.putUserProperty("order", String.valueOf(order));
                        SendResult r = p.send(m, selector, order);
                        MessageQueue q = r.getMessageQueue();
                        Out.event("sent", "i", i, "body", Out.body(m.getBody()), "status", r.getSendStatus().name(),
                            "msgId", r.getMsgId(), "queueId", q.getQueueId(), "order", order,
                            "queueOffset", r.getQueueOffset());
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown --mode " + mode);
            }
        } finally {
            Out.event("summary", "failed", failed.get());
            if (a.flag("trace")) {
                // The trace records go out from the client's asynchronous dispatcher, in batches; its flush at
                // shutdown can give up before the first batch (and the trace topic's route) is sent.
                Thread.sleep(a.integer("settle", 3000));
            }
            p.shutdown();
        }
    }
}
