package txmq.compat;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * DefaultMQPushConsumer (--listener concurrent|orderly, --model CLUSTERING|BROADCASTING, --sql or --tags) and
 * DefaultLitePullConsumer (--assign or subscribe). One "received" line per delivery; stops after --expect
 * deliveries plus --settle ms of quiet (to catch duplicates), or at --timeout seconds.
 */
final class Consume {
    private Consume() {
    }

    private static ConsumeFromWhere fromWhere(String s) {
        switch (s) {
            case "first":
                return ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET;
            case "last":
                return ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET;
            case "timestamp":
                return ConsumeFromWhere.CONSUME_FROM_TIMESTAMP;
            default:
                throw new IllegalArgumentException("unknown --from " + s);
        }
    }

    private static void waitFor(Args a, AtomicInteger received) throws InterruptedException {
        int expect = a.integer("expect", 1);
        // 75 s by default: a rebalance heartbeat that loses the client's heartbeat lock leaves the broker with an old
        // subscription version, and pulls are refused until the next heartbeat, 30 s later (docs/wire-notes.md).
        long deadline = System.currentTimeMillis() + a.integer("timeout", 75) * 1000L;
        while (received.get() < expect && System.currentTimeMillis() < deadline) {
            Thread.sleep(50);
        }
        Thread.sleep(a.integer("settle", 1000));
        Out.event("summary", "received", received.get());
    }

    /** MessageModel moved package between 4.x and 5.x; the setter's parameter type names it on either line. */
    @SuppressWarnings({"unchecked", "rawtypes"})
    private static void setMessageModel(DefaultMQPushConsumer c, String model) throws Exception {
        for (java.lang.reflect.Method m : DefaultMQPushConsumer.class.getMethods()) {
            if (m.getName().equals("setMessageModel")) {
                m.invoke(c, Enum.valueOf((Class<Enum>) m.getParameterTypes()[0], model));
                return;
            }
        }
        throw new IllegalStateException("no setMessageModel");
    }

    static void push(Args a) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.need("group"), Clients.aclHook(a),
            new AllocateMessageQueueAveragely(), a.flag("trace"), null);
        c.setNamesrvAddr(a.need("namesrv"));
        c.setConsumeFromWhere(fromWhere(a.get("from", "first")));
        if (a.get("timestamp", null) != null) {
            c.setConsumeTimestamp(a.need("timestamp"));
        }
        setMessageModel(c, a.get("model", "CLUSTERING"));
        c.setMaxReconsumeTimes(a.integer("max-reconsume", 16));
        if (a.get("instance", null) != null) {
            c.setInstanceName(a.need("instance"));
        }
        String sql = a.get("sql", null);
        if (sql != null) {
            c.subscribe(a.need("topic"), MessageSelector.bySql(sql));
        } else {
            c.subscribe(a.need("topic"), a.get("tags", "*"));
        }
        Set<String> fail = new HashSet<>(a.all("fail-body"));
        AtomicInteger received = new AtomicInteger();
        if (a.get("listener", "concurrent").equals("orderly")) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    Out.event("received", Clients.concat(Clients.seen(m), "thread", Thread.currentThread().getName()));
                    received.incrementAndGet();
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                boolean later = false;
                for (MessageExt m : msgs) {
                    Out.event("received", Clients.seen(m));
                    received.incrementAndGet();
                    later |= fail.contains(Out.body(m.getBody()));
                }
                return later ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        try {
            c.start();
        } catch (Exception e) {
            Clients.error("start", e);
            Out.event("summary", "received", 0);
            return;
        }
        Out.event("ready");
        waitFor(a, received);
        c.shutdown();
    }

    static void litePull(Args a) throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(a.need("group"), Clients.aclHook(a));
        c.setNamesrvAddr(a.need("namesrv"));
        c.setConsumeFromWhere(fromWhere(a.get("from", "first")));
        c.setAutoCommit(true);
        String topic = a.need("topic");
        if (a.flag("assign")) {
            long since = a.longer("seek-timestamp", -1);
            List<MessageQueue> assigned;
            if (since < 0) {
                // A new group starts at the first offset (CONSUME_FROM_FIRST_OFFSET): nothing to seek.
                c.start();
                assigned = new ArrayList<>(c.fetchMessageQueues(topic));
                c.assign(assigned);
            } else {
                // The client's seek races with pulls already running for the queue (a result fetched before the
                // seek can still be handed out), so the queues are assigned paused before start(), sought, and
                // only then resumed: no pull happens before the seek. A second consumer finds the queues.
                DefaultLitePullConsumer probe = new DefaultLitePullConsumer(a.need("group") + "_probe", Clients.aclHook(a));
                probe.setNamesrvAddr(a.need("namesrv"));
                probe.start();
                try {
                    assigned = new ArrayList<>(probe.fetchMessageQueues(topic));
                } finally {
                    probe.shutdown();
                }
                c.assign(assigned);
                c.pause(assigned);
                c.start();
                for (MessageQueue q : assigned) {
                    // SEARCH_OFFSET_BY_TIMESTAMP: the first message stored at or after that instant.
                    c.seek(q, c.offsetForTimestamp(q, since));
                }
                c.resume(assigned);
            }
            Out.event("assigned", "queues", assigned.size());
        } else {
            c.subscribe(topic, a.get("tags", "*"));
            c.start();
        }
        Out.event("ready");
        int expect = a.integer("expect", 1);
        int received = 0;
        long deadline = System.currentTimeMillis() + a.integer("timeout", 30) * 1000L;
        long quietUntil = Long.MAX_VALUE;
        while (System.currentTimeMillis() < Math.min(deadline, quietUntil)) {
            for (MessageExt m : c.poll(200)) {
                Out.event("received", Clients.seen(m));
                received++;
            }
            if (received >= expect && quietUntil == Long.MAX_VALUE) {
                quietUntil = System.currentTimeMillis() + a.integer("settle", 1000);
            }
        }
        Out.event("summary", "received", received);
        c.shutdown();
    }
}
