// Command txmqgo drives the official Go client (github.com/apache/rocketmq-client-go/v2) against a name server
// and prints what it saw as JSON lines on stdout, one event per line. It passes no verdicts: pytest does.
//
//	txmqgo send    --namesrv ADDR --topic T [--count N] [--mode sync|async|oneway|batch] [--keys FMT] ...
//	txmqgo tx      --namesrv ADDR --topic T --group G --plan commit,rollback,unknown:commit,unknown:rollback ...
//	               (a plan item is the local transaction's answer, then after ':' the check-back's answer)
//	txmqgo request --namesrv ADDR --topic T [--count N] [--reply-timeout 10s]
//	txmqgo consume --namesrv ADDR --topic T --group G [--expect N] [--timeout S] [--linger S] [--create-topic BROKER]
//
// In --keys, "{i}" stands for the message's index. The client's own log goes to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

const (
	exitOK         = 0
	exitClient     = 1
	exitUsage      = 2
	exitDeadline   = 3
	exitIncomplete = 4
)

var outMu sync.Mutex

// emit prints one event as a JSON line; lines from different goroutines never interleave.
func emit(event string, fields map[string]interface{}) {
	record := map[string]interface{}{"event": event, "ts": float64(time.Now().UnixNano()) / 1e9}
	for k, v := range fields {
		record[k] = v
	}
	line, err := json.Marshal(record)
	if err != nil {
		line = []byte(fmt.Sprintf(`{"event":"error","error":%q}`, err.Error()))
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

func fail(code int, format string, args ...interface{}) {
	emit("error", map[string]interface{}{"error": fmt.Sprintf(format, args...)})
	os.Exit(code)
}

type common struct {
	namesrv  string
	topic    string
	group    string
	logLevel string
}

func (c *common) register(fs *flag.FlagSet, defaultGroup string) {
	fs.StringVar(&c.namesrv, "namesrv", "127.0.0.1:9876", "name server address(es), ';' separated")
	fs.StringVar(&c.topic, "topic", "", "topic")
	fs.StringVar(&c.group, "group", defaultGroup, "producer or consumer group")
	fs.StringVar(&c.logLevel, "log-level", "warn", "the Go client's log level (stderr)")
}

func (c *common) check(fs *flag.FlagSet) {
	if c.topic == "" {
		fmt.Fprintln(os.Stderr, "--topic is required")
		fs.Usage()
		os.Exit(exitUsage)
	}
	rlog.SetLogLevel(c.logLevel)
}

func (c *common) nameservers() []string {
	return strings.Split(c.namesrv, ";")
}

func keysFor(format string, i int) []string {
	if format == "" {
		return nil
	}
	return strings.Split(strings.ReplaceAll(format, "{i}", fmt.Sprint(i)), ",")
}

func messageFields(m *primitive.MessageExt) map[string]interface{} {
	fields := map[string]interface{}{
		"body":            string(m.Body),
		"topic":           m.Topic,
		"tags":            m.GetTags(),
		"keys":            m.GetKeys(),
		"msg_id":          m.MsgId,
		"offset_msg_id":   m.OffsetMsgId,
		"queue_offset":    m.QueueOffset,
		"reconsume_times": m.ReconsumeTimes,
		"properties":      m.GetProperties(),
	}
	if m.Queue != nil {
		fields["queue_id"] = m.Queue.QueueId
		fields["broker_name"] = m.Queue.BrokerName
	}
	return fields
}

func sendResultFields(r *primitive.SendResult) map[string]interface{} {
	fields := map[string]interface{}{
		"status":         int(r.Status),
		"msg_id":         r.MsgID,
		"offset_msg_id":  r.OffsetMsgID,
		"queue_offset":   r.QueueOffset,
		"transaction_id": r.TransactionID,
	}
	if r.MessageQueue != nil {
		fields["queue_id"] = r.MessageQueue.QueueId
		fields["broker_name"] = r.MessageQueue.BrokerName
	}
	return fields
}

// ---- send: plain synchronous sends ----

func runSend(args []string) int {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	var c common
	c.register(fs, "txmqgo_pg")
	count := fs.Int("count", 1, "messages to send")
	prefix := fs.String("body-prefix", "go-", "body is PREFIX + index (padded with '.' to --body-size)")
	bodySize := fs.Int("body-size", 0, "pad each body to this many bytes (the client compresses bodies over 4 KiB)")
	tag := fs.String("tag", "", "tag")
	keys := fs.String("keys", "", "keys, {i} is the index, ',' separates several")
	mode := fs.String("mode", "sync", "sync, async, oneway or batch (one SendSync with every message)")
	fs.Parse(args)
	c.check(fs)

	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(c.nameservers())),
		producer.WithGroupName(c.group),
		producer.WithRetry(2),
	)
	if err != nil {
		fail(exitClient, "new producer: %v", err)
	}
	if err := p.Start(); err != nil {
		fail(exitClient, "start producer: %v", err)
	}
	defer p.Shutdown()
	msgs := make([]*primitive.Message, *count)
	for i := range msgs {
		body := fmt.Sprintf("%s%d", *prefix, i)
		if len(body) < *bodySize {
			body += strings.Repeat(".", *bodySize-len(body))
		}
		msgs[i] = primitive.NewMessage(c.topic, []byte(body))
		if *tag != "" {
			msgs[i].WithTag(*tag)
		}
		if k := keysFor(*keys, i); k != nil {
			msgs[i].WithKeys(k)
		}
	}
	var mu sync.Mutex
	failed := 0
	report := func(body string, res *primitive.SendResult, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed++
			emit("send_failed", map[string]interface{}{"body": body, "error": err.Error()})
			return
		}
		fields := sendResultFields(res)
		fields["body"] = body
		emit("sent", fields)
	}
	timeout := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	switch *mode {
	case "sync":
		for _, m := range msgs {
			ctx, cancel := timeout()
			res, err := p.SendSync(ctx, m)
			cancel()
			report(string(m.Body), res, err)
		}
	case "async":
		var wg sync.WaitGroup
		for _, m := range msgs {
			body := string(m.Body)
			wg.Add(1)
			err := p.SendAsync(context.Background(), func(ctx context.Context, res *primitive.SendResult, err error) {
				defer wg.Done()
				report(body, res, err)
			}, m)
			if err != nil {
				wg.Done()
				report(body, nil, err)
			}
		}
		wg.Wait()
	case "oneway":
		for _, m := range msgs {
			ctx, cancel := timeout()
			if err := p.SendOneWay(ctx, m); err != nil {
				report(string(m.Body), nil, err)
			} else {
				emit("sent_oneway", map[string]interface{}{"body": string(m.Body)})
			}
			cancel()
		}
	case "batch":
		ctx, cancel := timeout()
		res, err := p.SendSync(ctx, msgs...)
		cancel()
		report(fmt.Sprintf("batch of %d", len(msgs)), res, err)
	default:
		fmt.Fprintf(os.Stderr, "unknown --mode %q\n", *mode)
		return exitUsage
	}
	emit("summary", map[string]interface{}{"mode": *mode, "count": *count, "failed": failed})
	if failed > 0 {
		return exitIncomplete
	}
	return exitOK
}

// ---- tx: a transaction producer following a plan ----

// step is what one message's local transaction answers, and, for UNKNOWN, what its check-back answers.
type step struct {
	local primitive.LocalTransactionState
	check primitive.LocalTransactionState
	name  string
}

func parseState(s string) (primitive.LocalTransactionState, bool) {
	switch s {
	case "commit":
		return primitive.CommitMessageState, true
	case "rollback":
		return primitive.RollbackMessageState, true
	case "unknown":
		return primitive.UnknowState, true
	}
	return 0, false
}

func stateName(s primitive.LocalTransactionState) string {
	switch s {
	case primitive.CommitMessageState:
		return "COMMIT"
	case primitive.RollbackMessageState:
		return "ROLLBACK"
	case primitive.UnknowState:
		return "UNKNOWN"
	}
	return fmt.Sprint(int(s))
}

func parsePlan(plan string) ([]step, error) {
	var steps []step
	for _, item := range strings.Split(plan, ",") {
		parts := strings.SplitN(strings.TrimSpace(item), ":", 2)
		local, ok := parseState(parts[0])
		if !ok {
			return nil, fmt.Errorf("bad plan item %q", item)
		}
		// A decided transaction should never be checked; if it is, the check repeats the decision.
		s := step{local: local, check: local, name: item}
		if len(parts) == 2 {
			if s.check, ok = parseState(parts[1]); !ok {
				return nil, fmt.Errorf("bad plan item %q", item)
			}
		}
		steps = append(steps, s)
	}
	return steps, nil
}

type planListener struct {
	mu        sync.Mutex
	byBody    map[string]step
	unplanned primitive.LocalTransactionState // the answer to a check of another instance's transaction
	checked   map[string]int                  // body -> check-backs seen
	changed   chan struct{}
}

func (l *planListener) stepFor(body string) (step, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.byBody[body]
	return s, ok
}

func (l *planListener) ExecuteLocalTransaction(msg *primitive.Message) primitive.LocalTransactionState {
	body := string(msg.Body)
	s, ok := l.stepFor(body)
	state := primitive.UnknowState
	if ok {
		state = s.local
	}
	emit("local", map[string]interface{}{
		"body":           body,
		"transaction_id": msg.TransactionId,
		"keys":           msg.GetKeys(),
		"state":          stateName(state),
	})
	return state
}

func (l *planListener) CheckLocalTransaction(msg *primitive.MessageExt) primitive.LocalTransactionState {
	body := string(msg.Body)
	s, ok := l.stepFor(body)
	state := l.unplanned
	if ok {
		state = s.check
	}
	fields := messageFields(msg)
	fields["planned"] = ok
	fields["transaction_id"] = msg.TransactionId
	fields["property_transaction_id"] = msg.GetProperty(primitive.PropertyTransactionID)
	fields["producer_group"] = msg.GetProperty(primitive.PropertyProducerGroup)
	fields["answer"] = stateName(state)
	emit("check", fields)
	l.mu.Lock()
	l.checked[body]++
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
	return state
}

// waitingFor lists the bodies left UNKNOWN by their local transaction that have had fewer than minChecks
// check-backs (at least one when their check answers COMMIT or ROLLBACK).
func (l *planListener) waitingFor(minChecks int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var waiting []string
	for body, s := range l.byBody {
		if s.local != primitive.UnknowState {
			continue
		}
		need := minChecks
		if s.check != primitive.UnknowState && need < 1 {
			need = 1
		}
		if l.checked[body] < need {
			waiting = append(waiting, body)
		}
	}
	return waiting
}

// unplannedChecked counts the transactions of other instances (bodies not in this plan) checked here.
func (l *planListener) unplannedChecked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for body := range l.checked {
		if _, ok := l.byBody[body]; !ok {
			n++
		}
	}
	return n
}

func runTx(args []string) int {
	fs := flag.NewFlagSet("tx", flag.ExitOnError)
	var c common
	c.register(fs, "txmqgo_txpg")
	planText := fs.String("plan", "commit,rollback,unknown:commit,unknown:rollback", "one item per message")
	prefix := fs.String("body-prefix", "gotx-", "body is PREFIX + index + '-' + plan item")
	tag := fs.String("tag", "", "tag")
	keys := fs.String("keys", "gotx-key-{i}", "keys, {i} is the index, ',' separates several")
	timeout := fs.Float64("timeout", 60, "seconds to wait for the planned check-backs")
	linger := fs.Float64("linger", 0, "seconds to stay up after the last planned check-back")
	waitChecks := fs.Int("wait-checks", 0, "also wait until each UNKNOWN transaction has had this many check-backs")
	unplanned := fs.String("check-unplanned", "unknown", "answer to checks of transactions not in the plan")
	waitUnplanned := fs.Int("wait-unplanned", 0, "also wait until this many unplanned transactions were checked")
	fs.Parse(args)
	c.check(fs)
	steps, err := parsePlan(*planText)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitUsage
	}

	unplannedState, ok := parseState(*unplanned)
	if !ok {
		fmt.Fprintf(os.Stderr, "bad --check-unplanned %q\n", *unplanned)
		return exitUsage
	}
	listener := &planListener{
		byBody:    map[string]step{},
		unplanned: unplannedState,
		checked:   map[string]int{},
		changed:   make(chan struct{}, 1),
	}
	bodies := make([]string, len(steps))
	for i, s := range steps {
		bodies[i] = fmt.Sprintf("%s%d-%s", *prefix, i, strings.ReplaceAll(s.name, ":", "-"))
		listener.byBody[bodies[i]] = s
	}
	p, err := rocketmq.NewTransactionProducer(
		listener,
		producer.WithNsResolver(primitive.NewPassthroughResolver(c.nameservers())),
		producer.WithGroupName(c.group),
		producer.WithRetry(2),
	)
	if err != nil {
		fail(exitClient, "new transaction producer: %v", err)
	}
	if err := p.Start(); err != nil {
		fail(exitClient, "start transaction producer: %v", err)
	}
	defer p.Shutdown()
	emit("started", map[string]interface{}{"group": c.group})

	failed := 0
	for i, body := range bodies {
		msg := primitive.NewMessage(c.topic, []byte(body))
		if *tag != "" {
			msg.WithTag(*tag)
		}
		if k := keysFor(*keys, i); k != nil {
			msg.WithKeys(k)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := p.SendMessageInTransaction(ctx, msg)
		cancel()
		if err != nil {
			failed++
			emit("send_failed", map[string]interface{}{"body": body, "error": err.Error()})
			continue
		}
		fields := sendResultFields(res.SendResult)
		fields["body"] = body
		fields["keys"] = strings.Join(keysFor(*keys, i), " ")
		fields["state"] = stateName(res.State)
		emit("tx_sent", fields)
	}

	deadline := time.After(time.Duration(*timeout * float64(time.Second)))
	code := exitOK
	for len(listener.waitingFor(*waitChecks)) > 0 || listener.unplannedChecked() < *waitUnplanned {
		select {
		case <-listener.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			emit("timeout", map[string]interface{}{
				"waiting_for":       listener.waitingFor(*waitChecks),
				"unplanned_checked": listener.unplannedChecked(),
			})
			code = exitDeadline
		}
		if code != exitOK {
			break
		}
	}
	if code == exitOK && *linger > 0 {
		// Lingering keeps answering checks; SIGTERM ends it early and still prints the summary.
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		select {
		case <-time.After(time.Duration(*linger * float64(time.Second))):
		case <-stop:
		}
	}
	listener.mu.Lock()
	checks := map[string]int{}
	for k, v := range listener.checked {
		checks[k] = v
	}
	listener.mu.Unlock()
	emit("summary", map[string]interface{}{"sent": len(bodies) - failed, "failed": failed, "checks": checks})
	if code == exitOK && failed > 0 {
		code = exitIncomplete
	}
	return code
}

// ---- consume: a clustering push consumer ----

func runConsume(args []string) int {
	fs := flag.NewFlagSet("consume", flag.ExitOnError)
	var c common
	c.register(fs, "txmqgo_cg")
	expect := fs.Int("expect", 1, "exit after this many messages (plus --linger)")
	timeout := fs.Float64("timeout", 60, "seconds before giving up")
	linger := fs.Float64("linger", 0, "seconds to keep consuming after --expect messages, to catch duplicates")
	tag := fs.String("tag", "*", "subscription expression")
	fromFirst := fs.Bool("from-first", true, "CONSUME_FROM_FIRST_OFFSET for a new group")
	failFirst := fs.Bool("fail-first", false, "answer RECONSUME_LATER (or SUSPEND when orderly) on a body's first delivery")
	orderly := fs.Bool("orderly", false, "an orderly consumer (queue locks on the broker)")
	createOn := fs.String("create-topic", "", "first create the topic on this broker address with the Go admin client")
	fs.Parse(args)
	c.check(fs)
	if *createOn != "" {
		a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(c.nameservers())))
		if err != nil {
			fail(exitClient, "new admin: %v", err)
		}
		err = a.CreateTopic(context.Background(), admin.WithTopicCreate(c.topic), admin.WithBrokerAddrCreate(*createOn),
			admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4))
		a.Close()
		if err != nil {
			fail(exitClient, "create topic: %v", err)
		}
		emit("topic_created", map[string]interface{}{"topic": c.topic, "broker": *createOn})
	}

	where := consumer.ConsumeFromLastOffset
	if *fromFirst {
		where = consumer.ConsumeFromFirstOffset
	}
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver(c.nameservers())),
		consumer.WithGroupName(c.group),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(where),
		consumer.WithConsumerOrder(*orderly),
	)
	if err != nil {
		fail(exitClient, "new push consumer: %v", err)
	}
	var mu sync.Mutex
	received := 0
	seen := map[string]bool{}
	reached := make(chan struct{})
	err = pc.Subscribe(c.topic, consumer.MessageSelector{Type: consumer.TAG, Expression: *tag},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			for _, m := range msgs {
				mu.Lock()
				first := !seen[string(m.Body)]
				seen[string(m.Body)] = true
				mu.Unlock()
				if *failFirst && first {
					fields := messageFields(m)
					emit("failed_once", fields)
					if *orderly {
						return consumer.SuspendCurrentQueueAMoment, nil
					}
					return consumer.ConsumeRetryLater, nil
				}
			}
			for _, m := range msgs {
				emit("received", messageFields(m))
				mu.Lock()
				received++
				if received == *expect {
					close(reached)
				}
				mu.Unlock()
			}
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		fail(exitClient, "subscribe: %v", err)
	}
	if err := pc.Start(); err != nil {
		fail(exitClient, "start push consumer: %v", err)
	}
	emit("started", map[string]interface{}{"group": c.group})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	code := exitOK
	select {
	case <-reached:
		select {
		case <-time.After(time.Duration(*linger * float64(time.Second))):
		case <-stop:
		}
	case <-stop:
		code = exitIncomplete
	case <-time.After(time.Duration(*timeout * float64(time.Second))):
		code = exitDeadline
	}
	pc.Shutdown()
	mu.Lock()
	emit("summary", map[string]interface{}{"received": received, "expected": *expect})
	mu.Unlock()
	if code == exitOK && received < *expect {
		code = exitIncomplete
	}
	return code
}

// ---- request: request-reply (Producer.Request waits for the reply a consumer sends) ----

func runRequest(args []string) int {
	fs := flag.NewFlagSet("request", flag.ExitOnError)
	var c common
	c.register(fs, "txmqgo_req_pg")
	count := fs.Int("count", 1, "requests to send, one after another")
	prefix := fs.String("body-prefix", "go-ask-", "body is PREFIX + index")
	wait := fs.Duration("reply-timeout", 10*time.Second, "how long each request waits for its reply")
	fs.Parse(args)
	c.check(fs)

	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(c.nameservers())),
		producer.WithGroupName(c.group),
	)
	if err != nil {
		fail(exitClient, "new producer: %v", err)
	}
	if err := p.Start(); err != nil {
		fail(exitClient, "start producer: %v", err)
	}
	defer p.Shutdown()
	failed := 0
	for i := 0; i < *count; i++ {
		body := fmt.Sprintf("%s%d", *prefix, i)
		ctx, cancel := context.WithTimeout(context.Background(), *wait+5*time.Second)
		reply, err := p.Request(ctx, *wait, primitive.NewMessage(c.topic, []byte(body)))
		cancel()
		if err != nil {
			failed++
			emit("request_failed", map[string]interface{}{"body": body, "error": err.Error()})
			continue
		}
		emit("reply", map[string]interface{}{
			"i": i, "body": string(reply.Body), "topic": reply.Topic, "properties": reply.GetProperties(),
		})
	}
	emit("summary", map[string]interface{}{"failed": failed})
	if failed > 0 {
		return exitIncomplete
	}
	return exitOK
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: txmqgo send|tx|consume|request [options]")
		os.Exit(exitUsage)
	}
	var code int
	switch os.Args[1] {
	case "send":
		code = runSend(os.Args[2:])
	case "tx":
		code = runTx(os.Args[2:])
	case "consume":
		code = runConsume(os.Args[2:])
	case "request":
		code = runRequest(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", os.Args[1])
		code = exitUsage
	}
	os.Exit(code)
}
