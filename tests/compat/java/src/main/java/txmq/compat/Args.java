package txmq.compat;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** "--key value" options; a key given twice keeps every value (see {@link #all}). */
final class Args {
    private final Map<String, List<String>> values = new HashMap<>();

    Args(String[] argv, int from) {
        for (int i = from; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--")) {
                throw new IllegalArgumentException("expected --option, got " + a);
            }
            String key = a.substring(2);
            String val = (i + 1 < argv.length && !argv[i + 1].startsWith("--")) ? argv[++i] : "true";
            values.computeIfAbsent(key, k -> new ArrayList<>()).add(val);
        }
    }

    String get(String key, String dflt) {
        List<String> v = values.get(key);
        return v == null ? dflt : v.get(v.size() - 1);
    }

    String need(String key) {
        String v = get(key, null);
        if (v == null) {
            throw new IllegalArgumentException("--" + key + " is required");
        }
        return v;
    }

    int integer(String key, int dflt) {
        return Integer.parseInt(get(key, String.valueOf(dflt)));
    }

    long longer(String key, long dflt) {
        return Long.parseLong(get(key, String.valueOf(dflt)));
    }

    boolean flag(String key) {
        return Boolean.parseBoolean(get(key, "false"));
    }

    List<String> all(String key) {
        List<String> v = values.get(key);
        return v == null ? new ArrayList<>() : v;
    }

    /** "--prop k=v" given any number of times; "{i}" in a value is replaced by the message index. */
    Map<String, String> props(int index) {
        Map<String, String> out = new LinkedHashMap<>();
        for (String kv : all("prop")) {
            int eq = kv.indexOf('=');
            out.put(kv.substring(0, eq), kv.substring(eq + 1).replace("{i}", String.valueOf(index)));
        }
        return out;
    }
}
