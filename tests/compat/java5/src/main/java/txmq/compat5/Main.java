package txmq.compat5;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.SessionCredentialsProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * Scenarios for the official RocketMQ 5.x Java client (gRPC). Each prints one JSON object per line: what it sent or
 * received, then a summary. Pytest (tests/compat/test_java5_client.py) decides what is right.
 *
 * <pre>
 *   produce ENDPOINTS TOPIC COUNT [GROUP_PATTERN|-] [DELAY_MS]
 *   receive ENDPOINTS TOPIC GROUP EXPECT SECONDS [noack]
 *   push    ENDPOINTS TOPIC GROUP EXPECT SECONDS [fail]
 *   transaction ENDPOINTS TOPIC COUNT commit|rollback|die [HOLD_SECONDS]
 *   bench   ENDPOINTS TOPIC INFLIGHT SECONDS [SIZE]      (bench/bench_grpc.py's load generator, see Bench)
 * </pre>
 * A transactional producer's checker answers COMMIT and prints each check; with HOLD_SECONDS it stays up until the
 * first check (plus a moment for its answer) or that long; "die" halts the JVM right after the first half message.
 */
public final class Main {
    private Main() {
    }

    static synchronized void emit(String event, Map<String, Object> fields) {
        StringBuilder out = new StringBuilder("{\"event\": ").append(quote(event));
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            out.append(", ").append(quote(e.getKey())).append(": ");
            Object v = e.getValue();
            if (v == null) {
                out.append("null");
            } else if (v instanceof Number || v instanceof Boolean) {
                out.append(v);
            } else {
                out.append(quote(String.valueOf(v)));
            }
        }
        System.out.println(out.append('}'));
        System.out.flush();
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static Map<String, Object> fields(Object... kv) {
        Map<String, Object> m = new java.util.LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    static ClientConfiguration configuration(String endpoints) {
        String ak = System.getenv().getOrDefault("TXMQ_AK", "");
        String sk = System.getenv().getOrDefault("TXMQ_SK", "");
        SessionCredentialsProvider credentials = new StaticSessionCredentialsProvider(ak, sk);
        return ClientConfiguration.newBuilder()
            .setEndpoints(endpoints)
            .enableSsl(false)
            .setCredentialProvider(credentials)
            .setRequestTimeout(Duration.ofSeconds(3))
            .build();
    }

    static Map<String, Object> describe(MessageView m) {
        ByteBuffer body = m.getBody();
        byte[] bytes = new byte[body.remaining()];
        body.get(bytes);
        return fields(
            "id", m.getMessageId().toString(),
            "topic", m.getTopic(),
            "body", new String(bytes, StandardCharsets.UTF_8),
            "tag", m.getTag().orElse(null),
            "group", m.getMessageGroup().orElse(null),
            "attempt", m.getDeliveryAttempt(),
            "index", m.getProperties().get("index"),
            "at", System.currentTimeMillis() / 1000.0);
    }

    static int produce(String[] a) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = a[2];
        int count = Integer.parseInt(a[3]);
        String groupPattern = a.length > 4 && !"-".equals(a[4]) ? a[4] : null;
        long delayMs = a.length > 5 ? Long.parseLong(a[5]) : 0;
        int sent = 0;
        int failed = 0;
        try (Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(configuration(a[1])).setTopics(topic).build()) {
            for (int i = 0; i < count; i++) {
                String body = "j-" + i;
                MessageBuilder builder = provider.newMessageBuilder().setTopic(topic).setTag("TagJ")
                    .setKeys("key-" + i).setBody(body.getBytes(StandardCharsets.UTF_8))
                    .addProperty("index", String.valueOf(i));
                if (groupPattern != null) {
                    builder.setMessageGroup(groupPattern.replace("{k}", String.valueOf(i % 3)));
                }
                long deliverAt = delayMs > 0 ? System.currentTimeMillis() + delayMs : 0;
                if (deliverAt > 0) {
                    builder.setDeliveryTimestamp(deliverAt);
                }
                Message message = builder.build();
                try {
                    SendReceipt receipt = producer.send(message);
                    sent++;
                    emit("sent", fields("index", i, "id", receipt.getMessageId().toString(), "body", body,
                        "at", System.currentTimeMillis() / 1000.0, "deliverAt", deliverAt / 1000.0));
                } catch (Exception e) {
                    failed++;
                    emit("send_failed", fields("index", i, "error", e.toString()));
                }
            }
        }
        emit("summary", fields("sent", sent, "failed", failed));
        return 0;
    }

    static int receive(String[] a) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = a[2];
        int expect = Integer.parseInt(a[4]);
        long end = System.currentTimeMillis() + (long) (Double.parseDouble(a[5]) * 1000);
        boolean ack = !(a.length > 6 && "noack".equals(a[6]));
        int got = 0;
        int acked = 0;
        Map<String, FilterExpression> subscription =
            Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG));
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(configuration(a[1])).setConsumerGroup(a[3])
            // 3 s: RocketMQ's proxy refuses (40018) a receive whose deadline (the request timeout, 3 s, plus this)
            // leaves less than its minimum long polling, 5 s, plus 100 ms.
            .setAwaitDuration(Duration.ofSeconds(3)).setSubscriptionExpressions(subscription).build()) {
            while (System.currentTimeMillis() < end && got < expect) {
                List<MessageView> messages;
                try {
                    messages = consumer.receive(16, Duration.ofSeconds(15));
                } catch (Exception e) {
                    emit("receive_failed", fields("error", e.toString()));
                    Thread.sleep(200);
                    continue;
                }
                for (MessageView m : messages) {
                    got++;
                    emit("received", describe(m));
                    if (ack) {
                        consumer.ack(m);
                        acked++;
                    }
                }
            }
        }
        emit("summary", fields("received", got, "acked", acked));
        return 0;
    }

    static int push(String[] a) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = a[2];
        int expect = Integer.parseInt(a[4]);
        double seconds = Double.parseDouble(a[5]);
        boolean fail = a.length > 6 && "fail".equals(a[6]);
        CountDownLatch done = new CountDownLatch(expect);
        AtomicInteger consumed = new AtomicInteger();
        Map<String, FilterExpression> subscription = new HashMap<>();
        subscription.put(topic, new FilterExpression("*", FilterExpressionType.TAG));
        PushConsumer consumer = provider.newPushConsumerBuilder()
            .setClientConfiguration(configuration(a[1])).setConsumerGroup(a[3])
            .setSubscriptionExpressions(subscription)
            .setMessageListener(m -> {
                Map<String, Object> f = describe(m);
                f.put("result", fail ? "FAILURE" : "SUCCESS");
                emit("consumed", f);
                consumed.incrementAndGet();
                done.countDown();
                return fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
            })
            .build();
        try {
            done.await((long) (seconds * 1000), TimeUnit.MILLISECONDS);
        } finally {
            consumer.close();
        }
        emit("summary", fields("consumed", consumed.get()));
        return 0;
    }

    static int transaction(String[] a) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = a[2];
        int count = Integer.parseInt(a[3]);
        String mode = a[4];
        double hold = a.length > 5 ? Double.parseDouble(a[5]) : 0;
        CountDownLatch checked = new CountDownLatch(1);
        Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(configuration(a[1])).setTopics(topic)
            .setTransactionChecker(m -> {
                emit("checked", describe(m));
                checked.countDown();
                return TransactionResolution.COMMIT;
            })
            .build();
        try {
            for (int i = 0; i < count; i++) {
                String body = "jtx-" + i;
                Message message = provider.newMessageBuilder().setTopic(topic).setKeys("key-" + i)
                    .setBody(body.getBytes(StandardCharsets.UTF_8)).build();
                Transaction tx = producer.beginTransaction();
                SendReceipt receipt = producer.send(message, tx);
                emit("half", fields("index", i, "id", receipt.getMessageId().toString(), "body", body));
                if ("die".equals(mode)) {
                    Runtime.getRuntime().halt(9);  // the orphan: no decision, no shutdown hooks
                }
                if ("commit".equals(mode)) {
                    tx.commit();
                } else {
                    tx.rollback();
                }
                emit("ended", fields("index", i, "id", receipt.getMessageId().toString(), "resolution", mode));
            }
            if (hold > 0 && checked.await((long) (hold * 1000), TimeUnit.MILLISECONDS)) {
                Thread.sleep(2000);  // the client answers (EndTransaction) after the checker returns
            }
        } finally {
            producer.close();
        }
        emit("summary", fields("checked", checked.getCount() == 0));
        return 0;
    }

    public static void main(String[] args) throws Exception {
        int code;
        switch (args[0]) {
            case "produce":
                code = produce(args);
                break;
            case "receive":
                code = receive(args);
                break;
            case "push":
                code = push(args);
                break;
            case "transaction":
                code = transaction(args);
                break;
            case "bench":
                code = Bench.run(args);
                break;
            default:
                System.err.println("unknown scenario " + args[0]);
                code = 2;
        }
        System.exit(code);
    }
}
