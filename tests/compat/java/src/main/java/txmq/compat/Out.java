package txmq.compat;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Map;

/** One JSON object per line on stdout: what a scenario saw. pytest reads these lines and decides. */
final class Out {
    private static final PrintStream OUT = new PrintStream(System.out, true);

    private Out() {
    }

    /** Prints {"event": name, k1: v1, ...}; values may be strings, numbers, booleans, null or string maps. */
    static synchronized void event(String name, Object... kv) {
        StringBuilder sb = new StringBuilder(128);
        sb.append("{\"event\":");
        value(sb, name);
        for (int i = 0; i + 1 < kv.length; i += 2) {
            sb.append(',');
            value(sb, String.valueOf(kv[i]));
            sb.append(':');
            value(sb, kv[i + 1]);
        }
        sb.append('}');
        OUT.println(sb);
    }

    static String body(byte[] body) {
        return body == null ? null : new String(body, StandardCharsets.UTF_8);
    }

    private static void value(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof Number || v instanceof Boolean) {
            sb.append(v);
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                value(sb, String.valueOf(e.getKey()));
                sb.append(':');
                value(sb, e.getValue());
            }
            sb.append('}');
        } else {
            String s = v.toString();
            sb.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"': sb.append("\\\""); break;
                    case '\\': sb.append("\\\\"); break;
                    case '\n': sb.append("\\n"); break;
                    case '\r': sb.append("\\r"); break;
                    case '\t': sb.append("\\t"); break;
                    default:
                        if (c < 0x20) {
                            sb.append(String.format("\\u%04x", (int) c));
                        } else {
                            sb.append(c);
                        }
                }
            }
            sb.append('"');
        }
    }
}
