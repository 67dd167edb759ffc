package txmq.compat;

import java.lang.reflect.Method;

/**
 * Scenarios of the official RocketMQ Java client against txmq. Usage: {@code Main SCENARIO --namesrv HOST:PORT ...}.
 * Each prints JSON lines (see {@link Out}); none decides pass or fail.
 */
public final class Main {
    private Main() {
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) {
            System.err.println("usage: Main produce|tx-produce|tx-check|consume|lite-pull|request|replier|seed004|seed-listener ...");
            System.exit(2);
        }
        Args a = new Args(argv, 1);
        switch (argv[0]) {
            case "produce":
                Produce.run(a);
                break;
            case "tx-produce":
                Transactions.produce(a);
                break;
            case "tx-check":
                Transactions.checker(a);
                break;
            case "seed-listener":
                Transactions.seedListener(a);
                break;
            case "consume":
                Consume.push(a);
                break;
            case "lite-pull":
                Consume.litePull(a);
                break;
            case "request":
                RequestReply.request(a);
                break;
            case "replier":
                RequestReply.replier(a);
                break;
            case "bench":
                Bench.run(a);
                break;
            case "seed004":
                // Only in the 4.x build (src/legacy): its API was removed from the 5.x client.
                Class<?> legacy = Class.forName("txmq.compat.Seed004");
                Method run = legacy.getDeclaredMethod("run", Args.class);
                run.invoke(null, a);
                break;
            default:
                System.err.println("unknown scenario " + argv[0]);
                System.exit(2);
        }
        // The client leaves non-daemon threads behind after shutdown(); a scenario that returned is done.
        System.exit(0);
    }
}
