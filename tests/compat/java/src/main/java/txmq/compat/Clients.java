package txmq.compat;

import java.util.Map;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;

/** What every scenario shares: the ACL hook, the message a scenario sends, and how an error is printed. */
final class Clients {
    private Clients() {
    }

    /** --ak/--sk: the official ACL hook, as the seeds' programs install it; null without them. */
    static RPCHook aclHook(Args a) {
        String ak = a.get("ak", null);
        if (ak == null) {
            return null;
        }
        return new AclClientRPCHook(new SessionCredentials(ak, a.need("sk")));
    }

    static String body(Args a, int i) {
        String body = a.get("body-prefix", "m-") + i;
        int size = a.integer("body-size", 0);
        if (size > body.length()) {
            StringBuilder sb = new StringBuilder(size).append(body).append(':');
            while (sb.length() < size) {
                sb.append((char) ('a' + sb.length() % 26));
            }
            body = sb.toString();
        }
        return body;
    }

    static Message message(Args a, int i) {
        String keys = a.get("keys", null);
        Message m = new Message(a.need("topic"), a.get("tag", ""), keys == null ? "" : keys.replace("{i}", "" + i),
            body(a, i).getBytes(java.nio.charset.StandardCharsets.UTF_8));
        int delay = a.integer("delay-level", 0);
        if (delay > 0) {
            m.setDelayTimeLevel(delay);
        }
        for (Map.Entry<String, String> e : a.props(i).entrySet()) {
            m.putUserProperty(e.getKey(), e.getValue());
        }
        return m;
    }

    /** The message as a consumer or a check saw it. */
    static Object[] seen(MessageExt m) {
        return new Object[] {
            "body", Out.body(m.getBody()), "msgId", m.getMsgId(), "topic", m.getTopic(), "tags", m.getTags(),
            "keys", m.getKeys(), "queueId", m.getQueueId(), "queueOffset", m.getQueueOffset(),
            "reconsumeTimes", m.getReconsumeTimes(), "bornHost", String.valueOf(m.getBornHostString()),
            "properties", m.getProperties(), "storeTimestamp", m.getStoreTimestamp(),
            "bornTimestamp", m.getBornTimestamp(), "bodyLength", m.getBody() == null ? 0 : m.getBody().length
        };
    }

    static Object[] concat(Object[] a, Object... b) {
        Object[] out = new Object[a.length + b.length];
        System.arraycopy(a, 0, out, 0, a.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }

    /** An exception as the application sees it: its class, RocketMQ's response code where it has one, its text. */
    static void error(String what, Throwable t) {
        Integer code = null;
        if (t instanceof MQBrokerException) {
            code = ((MQBrokerException) t).getResponseCode();
        } else if (t instanceof MQClientException) {
            code = ((MQClientException) t).getResponseCode();
        }
        Throwable cause = t.getCause();
        Out.event("error", "what", what, "type", t.getClass().getName(), "code", code,
            "message", String.valueOf(t.getMessage()),
            "cause", cause == null ? null : cause.getClass().getName() + ": " + cause.getMessage());
    }
}
