package txmq.compat;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/** TransactionMQProducer with a TransactionListener: local transactions, check-backs, a second instance. */
final class Transactions {
    private Transactions() {
    }

    private static LocalTransactionState state(String s) {
        switch (s) {
            case "COMMIT":
                return LocalTransactionState.COMMIT_MESSAGE;
            case "ROLLBACK":
                return LocalTransactionState.ROLLBACK_MESSAGE;
            case "UNKNOWN":
                return LocalTransactionState.UNKNOW;
            default:
                throw new IllegalArgumentException("unknown local transaction state " + s);
        }
    }

    static TransactionMQProducer producer(Args a, TransactionListener listener) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer(a.need("group"), Clients.aclHook(a));
        p.setNamesrvAddr(a.need("namesrv"));
        p.setSendMsgTimeout(a.integer("send-timeout", 5000));
        p.setTransactionListener(listener);
        String topic = a.get("topic", null);
        if (topic != null) {
            // 5.x producers learn brokers only from the topics they publish, so one that has sent nothing yet never
            // heartbeats and is never checked; 5.x added setTopics for this ("topics to initialize for a transaction
            // producer"). 4.x reaches every broker through TBW102 and has no such setter.
            try {
                DefaultMQProducer.class.getMethod("setTopics", java.util.List.class)
                    .invoke(p, java.util.Collections.singletonList(topic));
            } catch (NoSuchMethodException e) {
                // 4.x
            }
        }
        p.start();
        return p;
    }

    private static void checked(MessageExt m, String answer) {
        Out.event("checked", Clients.concat(Clients.seen(m), "transactionId", m.getTransactionId(),
            "uniqKey", m.getProperty("UNIQ_KEY"), "answer", answer, "checkedAt", System.currentTimeMillis()));
    }

    /**
     * --plan COMMIT,ROLLBACK,UNKNOWN>COMMIT,...: message i follows plan[i % n]; "UNKNOWN>X" is answered X when the broker
     * checks back. --hang-after-half: the first local transaction never returns (the test kills this JVM).
     * Lingers until every planned check has been answered with a final state, or --linger seconds (all of them
     * when no check is planned to end a transaction).
     */
    static void produce(Args a) throws Exception {
        String[] plan = a.get("plan", "COMMIT").split(",");
        int count = a.integer("count", plan.length);
        Map<String, String> answers = new ConcurrentHashMap<>();
        AtomicInteger finalChecks = new AtomicInteger();
        int expectedFinalChecks = 0;
        boolean hang = a.flag("hang-after-half");
        TransactionListener listener = new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                String body = new String(msg.getBody(), StandardCharsets.UTF_8);
                String step = answers.get(body);
                Out.event("executed", "body", body, "transactionId", msg.getTransactionId(),
                    "state", step.split(">")[0]);
                if (hang) {
                    try {
                        Thread.sleep(Long.MAX_VALUE);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
                return state(step.split(">")[0]);
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String body = Out.body(msg.getBody());
                String step = answers.getOrDefault(body, "UNKNOWN");
                String answer = step.contains(">") ? step.split(">")[1] : "UNKNOWN";
                checked(msg, answer);
                if (!answer.equals("UNKNOWN")) {
                    finalChecks.incrementAndGet();
                }
                return state(answer);
            }
        };
        TransactionMQProducer p = producer(a, listener);
        for (int i = 0; i < count; i++) {
            String step = plan[i % plan.length];
            if (step.contains(">")) {
                expectedFinalChecks++;
            }
            Message m = Clients.message(a, i);
            answers.put(Out.body(m.getBody()), step);
            try {
                TransactionSendResult r = p.sendMessageInTransaction(m, null);
                Out.event("sent", "i", i, "body", Out.body(m.getBody()), "status", r.getSendStatus().name(),
                    "msgId", r.getMsgId(), "offsetMsgId", r.getOffsetMsgId(), "transactionId", r.getTransactionId(),
                    "localState", r.getLocalTransactionState().name(), "queueId", r.getMessageQueue().getQueueId(),
                    "broker", r.getMessageQueue().getBrokerName());
            } catch (Exception e) {
                Clients.error("send " + i, e);
            }
        }
        long deadline = System.currentTimeMillis() + a.integer("linger", 0) * 1000L;
        // With no check planned to end anything, stay the whole --linger (to see the checks that do come).
        while ((expectedFinalChecks == 0 || finalChecks.get() < expectedFinalChecks)
            && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        if (expectedFinalChecks > 0) {
            Thread.sleep(500); // the answer to the last check leaves as a oneway END_TRANSACTION after it returns
        }
        Out.event("summary", "finalChecks", finalChecks.get(), "expectedFinalChecks", expectedFinalChecks);
        p.shutdown();
    }

    /** A second instance of the group: it sends nothing and answers every check with --answer. */
    static void checker(Args a) throws Exception {
        LocalTransactionState answer = state(a.get("answer", "COMMIT"));
        int expect = a.integer("expect", 1);
        AtomicInteger checks = new AtomicInteger();
        TransactionListener listener = new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                checked(msg, a.get("answer", "COMMIT"));
                checks.incrementAndGet();
                return answer;
            }
        };
        TransactionMQProducer p = producer(a, listener);
        Out.event("ready");
        long deadline = System.currentTimeMillis() + a.integer("linger", 30) * 1000L;
        while (checks.get() < expect && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        Thread.sleep(500); // let the oneway END_TRANSACTION of the last answer leave
        Out.event("summary", "checks", checks.get());
        p.shutdown();
    }

    /**
     * The seeds' TransactionListener producer as written there: its own check thread pool, sendMessageInTransaction(msg,
     * null) over five tags with keys KEY0..; every local transaction answers UNKNOWN and remembers a state per
     * transaction id (i % 3: 0 unknown, 1 commit, 2 rollback), which the check then reports.
     */
    static void seedListener(Args a) throws Exception {
        Map<String, Integer> local = new ConcurrentHashMap<>();
        AtomicInteger finals = new AtomicInteger();
        AtomicInteger index = new AtomicInteger();
        TransactionListener listener = new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                local.put(msg.getTransactionId(), index.getAndIncrement() % 3);
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Integer status = local.get(msg.getTransactionId());
                LocalTransactionState s = LocalTransactionState.UNKNOW;
                if (status != null && status == 1) {
                    s = LocalTransactionState.COMMIT_MESSAGE;
                } else if (status != null && status == 2) {
                    s = LocalTransactionState.ROLLBACK_MESSAGE;
                }
                if (s != LocalTransactionState.UNKNOW) {
                    finals.incrementAndGet();
                }
                checked(msg, s.name());
                return s;
            }
        };
        TransactionMQProducer p = new TransactionMQProducer(a.need("group"));
        ExecutorService pool = new ThreadPoolExecutor(2, 5, 100, TimeUnit.SECONDS, new ArrayBlockingQueue<>(2000),
            r -> {
                Thread t = new Thread(r);
                t.setName("client-transaction-msg-check-thread");
                return t;
            });
        p.setExecutorService(pool);
        p.setTransactionListener(listener);
        p.setNamesrvAddr(a.need("namesrv"));
        p.start();
        String[] tags = {"TagA", "TagB", "TagC", "TagD", "TagE"};
        int count = a.integer("count", 10);
        int decided = 0;
        for (int i = 0; i < count; i++) {
            Message m = new Message(a.need("topic"), tags[i % tags.length], "KEY" + i,
                ("Hello RocketMQ " + i).getBytes(StandardCharsets.UTF_8));
            TransactionSendResult r = p.sendMessageInTransaction(m, null);
            Out.event("sent", "i", i, "body", Out.body(m.getBody()), "status", r.getSendStatus().name(),
                "msgId", r.getMsgId(), "transactionId", r.getTransactionId());
            if (i % 3 != 0) {
                decided++;
            }
            Thread.sleep(10);
        }
        long deadline = System.currentTimeMillis() + a.integer("linger", 30) * 1000L;
        while (finals.get() < decided && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        Thread.sleep(500);
        Out.event("summary", "finalChecks", finals.get());
        p.shutdown();
        pool.shutdown();
    }
}
