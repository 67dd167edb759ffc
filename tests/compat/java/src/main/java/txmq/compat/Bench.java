package txmq.compat;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The load generator of bench/bench_rocketmq.py: one JVM, many threads, the same for every broker. Prints one
 * "result" event per run. --mode publish|tx|consume|latency, --inflight threads, --seconds, --size body bytes.
 * A tx window (half message, a no-op local transaction answering COMMIT, END_TRANSACTION) ends only when every
 * committed copy is in the topic (the sum of its queues' max offsets), since END_TRANSACTION is oneway.
 */
final class Bench {
    private Bench() {
    }

    static void run(Args a) throws Exception {
        switch (a.need("mode")) {
            case "publish":
                publish(a, false);
                break;
            case "tx":
                publish(a, true);
                break;
            case "consume":
                consume(a);
                break;
            case "latency":
                latency(a);
                break;
            default:
                throw new IllegalArgumentException("unknown --mode " + a.get("mode", ""));
        }
    }

    private static byte[] body(Args a) {
        byte[] b = new byte[a.integer("size", 1024)];
        Arrays.fill(b, (byte) 'x');
        return b;
    }

    private static long stored(DefaultMQProducer p, String topic) throws Exception {
        long total = 0;
        for (MessageQueue mq : p.fetchPublishMessageQueues(topic)) {
            total += p.maxOffset(mq);
        }
        return total;
    }

    static void publish(Args a, boolean transactional) throws Exception {
        String topic = a.need("topic");
        int threads = a.integer("inflight", 1);
        long seconds = a.longer("seconds", 10);
        byte[] body = body(a);
        DefaultMQProducer p;
        if (transactional) {
            TransactionMQProducer tp = new TransactionMQProducer(a.need("group"));
            tp.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
            });
            p = tp;
        } else {
            p = new DefaultMQProducer(a.need("group"));
        }
        p.setNamesrvAddr(a.need("namesrv"));
        p.setSendMsgTimeout(10000);
        p.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        p.start();
        // Warm-up: routes, connections, JIT.
        for (int i = 0; i < 200; i++) {
            send(p, new Message(topic, body), transactional);
        }
        long before = stored(p, topic);
        LongAdder done = new LongAdder();
        LongAdder failed = new LongAdder();
        long[][] latencies = new long[threads][];
        int[] counts = new int[threads];
        long cpu0 = cpuNanos();
        // bench/bench_grpc.py samples the broker's CPU at these two lines.
        Out.event("window", "phase", "start");
        long start = System.nanoTime();
        long end = start + seconds * 1_000_000_000L;
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int me = t;
            Thread w = new Thread(() -> {
                long[] mine = new long[1024];
                int n = 0;
                while (System.nanoTime() < end) {
                    long t0 = System.nanoTime();
                    try {
                        send(p, new Message(topic, body), transactional);
                        done.increment();
                    } catch (Exception e) {
                        failed.increment();
                        continue;
                    }
                    if (n == mine.length) {
                        mine = Arrays.copyOf(mine, n * 2);
                    }
                    mine[n++] = System.nanoTime() - t0;
                }
                latencies[me] = mine;
                counts[me] = n;
            });
            w.start();
            workers.add(w);
        }
        for (Thread w : workers) {
            w.join();
        }
        long sentAt = System.nanoTime();
        long cpu = cpuNanos() - cpu0;
        Out.event("window", "phase", "end");
        long[] all = new long[(int) done.sum()];
        int at = 0;
        for (int t = 0; t < threads; t++) {
            System.arraycopy(latencies[t], 0, all, at, counts[t]);
            at += counts[t];
        }
        Arrays.sort(all);
        double p50 = all.length == 0 ? -1 : all[all.length / 2] / 1e6;
        double p99 = all.length == 0 ? -1 : all[Math.min(all.length - 1, (int) (all.length * 0.99))] / 1e6;
        long expected = before + done.sum();
        if (transactional) {
            while (stored(p, topic) < expected && System.nanoTime() - sentAt < 30_000_000_000L) {
                Thread.sleep(5);
            }
        }
        long finished = System.nanoTime();
        double elapsed = (finished - start) / 1e9;
        Out.event("result", "mode", transactional ? "tx" : "publish", "inflight", threads, "count", done.sum(),
            "failed", failed.sum(), "seconds", elapsed, "rate", done.sum() / elapsed,
            "storedAfterSeconds", (finished - sentAt) / 1e9, "stored", stored(p, topic) - before,
            "windowSeconds", (sentAt - start) / 1e9, "p50_ms", p50, "p99_ms", p99, "client_cpu_s", cpu / 1e9);
        p.shutdown();
    }

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) java.lang.management.ManagementFactory
            .getOperatingSystemMXBean()).getProcessCpuTime();
    }

    private static void send(DefaultMQProducer p, Message m, boolean transactional) throws Exception {
        SendResult r = transactional ? p.sendMessageInTransaction(m, null) : p.send(m);
        if (r.getSendStatus() != org.apache.rocketmq.client.producer.SendStatus.SEND_OK) {
            throw new IllegalStateException(r.getSendStatus().name());
        }
    }

    private static DefaultMQPushConsumer consumer(Args a, MessageListenerConcurrently listener) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.need("group"));
        c.setNamesrvAddr(a.need("namesrv"));
        c.subscribe(a.need("topic"), "*");
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPullBatchSize(32);
        c.setConsumeMessageBatchMaxSize(32);
        c.registerMessageListener(listener);
        return c;
    }

    /** Reads --expect messages of a filled topic from its first offset; the rate from the first to the last. */
    static void consume(Args a) throws Exception {
        long expect = a.longer("expect", 1);
        LongAdder got = new LongAdder();
        AtomicLong first = new AtomicLong();
        CountDownLatch all = new CountDownLatch(1);
        DefaultMQPushConsumer c = consumer(a, (msgs, ctx) -> {
            first.compareAndSet(0, System.nanoTime());
            got.add(msgs.size());
            if (got.sum() >= expect) {
                all.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        boolean complete = all.await(a.longer("timeout", 120), java.util.concurrent.TimeUnit.SECONDS);
        double elapsed = (System.nanoTime() - first.get()) / 1e9;
        Out.event("result", "mode", "consume", "count", got.sum(), "complete", complete, "seconds", elapsed,
            "rate", got.sum() / elapsed);
        c.shutdown();
    }

    /**
     * --rate messages per second, paced over 64 threads of sync sends, for --seconds; a push consumer in this JVM notes
     * now - bornTimestamp for each (one clock). Pacing starts once the consumer has received a first message (its
     * route and rebalance are done) and the first second is left out.
     */
    static void latency(Args a) throws Exception {
        String topic = a.need("topic");
        double rate = Double.parseDouble(a.need("rate"));
        long seconds = a.longer("seconds", 10);
        byte[] body = body(a);
        int threads = 64;
        long[] samples = new long[(int) (rate * (seconds + 5)) + 1024];
        AtomicLong n = new AtomicLong();
        AtomicLong measureFrom = new AtomicLong(Long.MAX_VALUE);
        CountDownLatch first = new CountDownLatch(1);
        DefaultMQProducer p = new DefaultMQProducer(a.need("group") + "_P");
        p.setNamesrvAddr(a.need("namesrv"));
        p.setSendMsgTimeout(10000);
        p.start();
        p.send(new Message(topic, body));
        DefaultMQPushConsumer c = consumer(a, (msgs, ctx) -> {
            long now = System.currentTimeMillis();
            first.countDown();
            for (MessageExt m : msgs) {
                if (m.getBornTimestamp() >= measureFrom.get()) {
                    long i = n.getAndIncrement();
                    if (i < samples.length) {
                        samples[(int) i] = now - m.getBornTimestamp();
                    }
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        boolean ready = first.await(60, java.util.concurrent.TimeUnit.SECONDS);
        LongAdder failed = new LongAdder();
        long start = System.nanoTime();
        measureFrom.set(System.currentTimeMillis() + 1000);
        long total = (long) (rate * (seconds + 1));
        List<Thread> senders = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int me = t;
            Thread w = new Thread(() -> {
                for (long i = me; i < total; i += threads) {
                    long wait = start + (long) (i * 1e9 / rate) - System.nanoTime();
                    try {
                        if (wait > 0) {
                            Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                        }
                        p.send(new Message(topic, body));
                    } catch (Exception e) {
                        failed.increment();
                    }
                }
            });
            w.start();
            senders.add(w);
        }
        for (Thread w : senders) {
            w.join();
        }
        double sendSeconds = (System.nanoTime() - start) / 1e9;
        Thread.sleep(3000);
        int count = (int) Math.min(n.get(), samples.length);
        long[] seen = Arrays.copyOf(samples, count);
        Arrays.sort(seen);
        Out.event("result", "mode", "latency", "rate", rate, "achieved", total / sendSeconds, "ready", ready,
            "count", count, "failed", failed.sum(), "p50", count == 0 ? -1 : seen[count / 2],
            "p99", count == 0 ? -1 : seen[(int) (count * 0.99)], "max", count == 0 ? -1 : seen[count - 1]);
        p.shutdown();
        c.shutdown();
    }
}
