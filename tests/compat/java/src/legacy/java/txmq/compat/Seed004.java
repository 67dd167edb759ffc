package txmq.compat;

import java.nio.charset.StandardCharsets;
import org.apache.rocketmq.client.producer.LocalTransactionExecuter;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionCheckListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The seed's order-9527 producer, with the API it uses: a TransactionCheckListener for check-backs and a
 * LocalTransactionExecuter per send (4.x only; 5.x removed both). It sends, prints the result and shuts down at once.
 * --local COMMIT|ROLLBACK|UNKNOWN picks what the local transaction returns; --check is what a check-back answers.
 */
final class Seed004 {
    private Seed004() {
    }

    static LocalTransactionState state(String s) {
        return "COMMIT".equals(s) ? LocalTransactionState.COMMIT_MESSAGE
            : "ROLLBACK".equals(s) ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.UNKNOW;
    }

    static void run(Args a) throws Exception {
        final LocalTransactionState check = state(a.get("check", "COMMIT"));
        final LocalTransactionState local = state(a.get("local", "COMMIT"));
        TransactionCheckListener checkListener = new TransactionCheckListener() {
            @Override
            public LocalTransactionState checkLocalTransactionState(MessageExt m) {
                Out.event("checked", Clients.concat(Clients.seen(m), "transactionId", m.getTransactionId(),
                    "answer", check.name()));
                return check;
            }
        };
        TransactionMQProducer producer = new TransactionMQProducer(a.need("group"));
        producer.setNamesrvAddr(a.need("namesrv"));
        producer.setSendMsgTimeout(999999999);
        producer.setTransactionCheckListener(checkListener);
        LocalTransactionExecuter executer = new LocalTransactionExecuter() {
            @Override
            public LocalTransactionState executeLocalTransactionBranch(Message m, Object arg) {
                Out.event("executed", "body", new String(m.getBody(), StandardCharsets.UTF_8), "state", local.name());
                return local;
            }
        };
        producer.start();
        Message msg = new Message(a.need("topic"), "TagA", a.get("body", "9527").getBytes(StandardCharsets.UTF_8));
        SendResult r = producer.sendMessageInTransaction(msg, executer, null);
        Out.event("sent", "body", a.get("body", "9527"), "status", r.getSendStatus().name(), "msgId", r.getMsgId());
        int linger = a.integer("linger", 0);
        if (linger > 0) {
            Thread.sleep(linger * 1000L); // stay to answer check-backs
        }
        producer.shutdown();
    }
}
