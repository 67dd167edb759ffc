package txmq.compat5;

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.LongAdder;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * The 5.x Java load generator of bench/bench_grpc.py: one producer of the official client, INFLIGHT threads each
 * sending synchronously (as the 4.x Java Bench does), 1 KiB bodies by default.
 *
 * <pre>
 *   bench ENDPOINTS TOPIC INFLIGHT SECONDS [SIZE]
 * </pre>
 * Prints {"event": "window", "phase": "start"} and "end" around the measured window (the bench samples the broker's
 * CPU at those lines), then one "result" with the rate, latency percentiles and this JVM's CPU over the window.
 */
final class Bench {
    private Bench() {
    }

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
            .getProcessCpuTime();
    }

    static int run(String[] a) throws Exception {
        String endpoints = a[1];
        String topic = a[2];
        int threads = Integer.parseInt(a[3]);
        double seconds = Double.parseDouble(a[4]);
        byte[] body = new byte[a.length > 5 ? Integer.parseInt(a[5]) : 1024];
        Arrays.fill(body, (byte) 'x');
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration configuration = ClientConfiguration.newBuilder()
            .setEndpoints(endpoints)
            .enableSsl(false)
            .setCredentialProvider(new StaticSessionCredentialsProvider("", ""))
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
        try (Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(configuration).setTopics(topic).build()) {
            // Warm-up: route, channel, settings, JIT.
            for (int i = 0; i < 200; i++) {
                producer.send(message(provider, topic, body));
            }
            LongAdder failed = new LongAdder();
            long[][] latencies = new long[threads][];
            int[] counts = new int[threads];
            long cpu0 = cpuNanos();
            Main.emit("window", Main.fields("phase", "start"));
            long start = System.nanoTime();
            long end = start + (long) (seconds * 1e9);
            List<Thread> workers = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                final int me = t;
                Thread w = new Thread(() -> {
                    long[] mine = new long[1024];
                    int n = 0;
                    while (System.nanoTime() < end) {
                        long t0 = System.nanoTime();
                        try {
                            producer.send(message(provider, topic, body));
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
            double elapsed = (System.nanoTime() - start) / 1e9;
            long cpu = cpuNanos() - cpu0;
            Main.emit("window", Main.fields("phase", "end"));
            int total = 0;
            for (int c : counts) {
                total += c;
            }
            long[] all = new long[total];
            int at = 0;
            for (int t = 0; t < threads; t++) {
                System.arraycopy(latencies[t], 0, all, at, counts[t]);
                at += counts[t];
            }
            Arrays.sort(all);
            double p50 = total == 0 ? Double.NaN : all[total / 2] / 1e6;
            double p99 = total == 0 ? Double.NaN : all[Math.min(total - 1, (int) (total * 0.99))] / 1e6;
            Main.emit("result", Main.fields("msgs", total, "failed", failed.sum(), "seconds", elapsed,
                "rate", total / elapsed, "p50_ms", p50, "p99_ms", p99, "client_cpu_s", cpu / 1e9));
        }
        return 0;
    }

    private static Message message(ClientServiceProvider provider, String topic, byte[] body) {
        return provider.newMessageBuilder().setTopic(topic).setBody(body).build();
    }
}
