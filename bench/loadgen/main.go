// Command txmq-loadgen is the compiled load generator of bench/bench_rocketmq.py: it speaks RocketMQ's 4.x remoting
// protocol itself (JSON headers, as the Java client sends them) so that on a two-core machine the load costs a small
// part of what the Java client costs, and the brokers, not the generator, set the pace. The same program drives txmq
// and Apache RocketMQ.
//
// It sends what the Java client 4.9.8 sends for the same calls: SEND_MESSAGE_V2 (code 310) with the extFields a..k, m
// and the properties UNIQ_KEY and WAIT (plus TRAN_MSG and PGROUP for a half message, sysFlag 4), queues chosen round
// robin; a transaction is its half message, answered, then END_TRANSACTION (code 37) COMMIT oneway with
// tranStateTableOffset, commitLogOffset (from the answer's offsetMsgId), msgId (the UNIQ_KEY) and the answer's
// transactionId. All workers share one connection to the broker, with answers matched by opaque, as the Java client
// does. The broker comes from the topic's route at the name server.
//
//	txmq-loadgen --mode publish|tx --namesrv HOST:PORT --topic T --group G [--inflight N] [--seconds S] [--size B]
//
// It prints one JSON line {"event": "result", ...} with the fields of the Java generator (Bench.java): count, failed,
// rate, p50_ms, p99_ms, client_cpu_s, and for tx the committed copies found in the topic (stored). A tx window ends
// only when every committed copy is in the topic (the sum of its queues' max offsets, GET_MAX_OFFSET), since
// END_TRANSACTION is oneway.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	codeSendMessageV2 = 310
	codeEndTx         = 37
	codeGetMaxOffset  = 30
	codeGetRoute      = 105
	flagOneway        = 2
	flagResponse      = 1
	sysFlagPrepared   = 4
	commitType        = 8
	version           = 409 // MQVersion of the Java client 4.9.8
	nameSep           = "\x01"
	propSep           = "\x02"
)

type response struct {
	Code      int               `json:"code"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark"`
	ExtFields map[string]string `json:"extFields"`
	body      []byte
}

// conn is one connection shared by every worker: writes under a lock, a reader goroutine hands each answer to the
// request that waits for it.
type conn struct {
	c       net.Conn
	wmu     sync.Mutex
	opaque  atomic.Int32
	mu      sync.Mutex
	waiting map[int32]chan *response
	err     error
}

func dial(addr string) (*conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	k := &conn{c: c, waiting: make(map[int32]chan *response)}
	go k.read()
	return k, nil
}

func (k *conn) read() {
	r := bufio.NewReaderSize(k.c, 256<<10)
	var head [4]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			k.fail(err)
			return
		}
		size := binary.BigEndian.Uint32(head[:])
		if size < 4 || size > 64<<20 {
			k.fail(fmt.Errorf("bad frame length %d", size))
			return
		}
		frame := make([]byte, size)
		if _, err := io.ReadFull(r, frame); err != nil {
			k.fail(err)
			return
		}
		mark := binary.BigEndian.Uint32(frame[:4])
		if mark>>24 != 0 {
			k.fail(fmt.Errorf("header serialization %d: only JSON is read", mark>>24))
			return
		}
		headerLen := mark & 0xFFFFFF
		if 4+headerLen > size {
			k.fail(fmt.Errorf("header length %d past the frame (%d)", headerLen, size))
			return
		}
		resp := &response{}
		if err := json.Unmarshal(frame[4:4+headerLen], resp); err != nil {
			k.fail(fmt.Errorf("header: %w", err))
			return
		}
		resp.body = frame[4+headerLen:]
		if resp.Flag&flagResponse == 0 {
			continue // a request from the broker (a transaction check): every transaction here is decided at once
		}
		k.mu.Lock()
		ch := k.waiting[resp.Opaque]
		delete(k.waiting, resp.Opaque)
		k.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

func (k *conn) fail(err error) {
	k.mu.Lock()
	k.err = err
	for opaque, ch := range k.waiting {
		close(ch)
		delete(k.waiting, opaque)
	}
	k.mu.Unlock()
}

// frame writes a request's frame: the length, the header's (JSON, serialization type 0), the header, the body.
func frame(code int, opaque int32, flag int, ext []string, body []byte) []byte {
	var h strings.Builder
	h.WriteString(`{"code":`)
	h.WriteString(strconv.Itoa(code))
	h.WriteString(`,"extFields":{`)
	for i := 0; i < len(ext); i += 2 {
		if i > 0 {
			h.WriteByte(',')
		}
		writeJSONString(&h, ext[i])
		h.WriteByte(':')
		writeJSONString(&h, ext[i+1])
	}
	h.WriteString(`},"flag":`)
	h.WriteString(strconv.Itoa(flag))
	h.WriteString(`,"language":"GO","opaque":`)
	h.WriteString(strconv.Itoa(int(opaque)))
	h.WriteString(`,"serializeTypeCurrentRPC":"JSON","version":`)
	h.WriteString(strconv.Itoa(version))
	h.WriteByte('}')
	header := h.String()
	out := make([]byte, 8, 8+len(header)+len(body))
	binary.BigEndian.PutUint32(out[0:4], uint32(4+len(header)+len(body)))
	binary.BigEndian.PutUint32(out[4:8], uint32(len(header)))
	out = append(out, header...)
	return append(out, body...)
}

func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

func (k *conn) call(code int, ext []string, body []byte, timeout time.Duration) (*response, error) {
	opaque := k.opaque.Add(1)
	ch := make(chan *response, 1)
	k.mu.Lock()
	if k.err != nil {
		k.mu.Unlock()
		return nil, k.err
	}
	k.waiting[opaque] = ch
	k.mu.Unlock()
	if err := k.write(frame(code, opaque, 0, ext, body)); err != nil {
		return nil, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("connection lost: %v", k.err)
		}
		return resp, nil
	case <-timer.C:
		k.mu.Lock()
		delete(k.waiting, opaque)
		k.mu.Unlock()
		return nil, errors.New("timed out")
	}
}

func (k *conn) oneway(code int, ext []string) error {
	return k.write(frame(code, k.opaque.Add(1), flagOneway, ext, nil))
}

func (k *conn) write(b []byte) error {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	_, err := k.c.Write(b)
	return err
}

// route finds the topic's broker (brokerId 0 of its first broker) and write queue count at the name server. Apache
// RocketMQ writes brokerAddrs' keys as bare numbers ({0:"host:port"}), which is not JSON, so the fields are found
// by pattern.
var (
	routeAddr   = regexp.MustCompile(`"brokerAddrs":\{"?0"?:"([^"]+)"`)
	routeQueues = regexp.MustCompile(`"writeQueueNums":(\d+)`)
	routeName   = regexp.MustCompile(`"brokerName":"([^"]+)"`)
)

func route(namesrv, topic string) (addr, brokerName string, queues int, err error) {
	k, err := dial(namesrv)
	if err != nil {
		return "", "", 0, err
	}
	defer k.c.Close()
	resp, err := k.call(codeGetRoute, []string{"topic", topic}, nil, 5*time.Second)
	if err != nil {
		return "", "", 0, err
	}
	if resp.Code != 0 {
		return "", "", 0, fmt.Errorf("route of %s: code %d %s", topic, resp.Code, resp.Remark)
	}
	a, q, n := routeAddr.FindSubmatch(resp.body), routeQueues.FindSubmatch(resp.body), routeName.FindSubmatch(resp.body)
	if a == nil || q == nil || n == nil {
		return "", "", 0, fmt.Errorf("route of %s not understood: %s", topic, resp.body)
	}
	queues, _ = strconv.Atoi(string(q[1]))
	return string(a[1]), string(n[1]), queues, nil
}

type producer struct {
	k        *conn
	topic    string
	group    string
	queues   int
	body     []byte
	tx       bool
	next     atomic.Uint64
	keyStart string
}

// uniqKey is a message id of the Java client's shape: 32 hex digits, unique per message of this process.
func (p *producer) uniqKey(n uint64) string {
	const digits = "0123456789ABCDEF"
	var tail [12]byte
	for i := len(tail) - 1; i >= 0; i-- {
		tail[i] = digits[n&0xF]
		n >>= 4
	}
	return p.keyStart + string(tail[:])
}

// one sends a message (a half message with tx) and, for tx, commits it; the error is the send's.
func (p *producer) one() error {
	n := p.next.Add(1)
	key := p.uniqKey(n)
	props := "UNIQ_KEY" + nameSep + key + propSep + "WAIT" + nameSep + "true" + propSep
	sysFlag := "0"
	if p.tx {
		props = "TRAN_MSG" + nameSep + "true" + propSep + "PGROUP" + nameSep + p.group + propSep + props
		sysFlag = strconv.Itoa(sysFlagPrepared)
	}
	ext := []string{
		"a", p.group, "b", p.topic, "c", "TBW102", "d", "4", "e", strconv.Itoa(int(n % uint64(p.queues))),
		"f", sysFlag, "g", strconv.FormatInt(time.Now().UnixMilli(), 10), "h", "0", "i", props, "j", "0",
		"k", "false", "m", "false",
	}
	resp, err := p.k.call(codeSendMessageV2, ext, p.body, 10*time.Second)
	if err != nil {
		return err
	}
	if resp.Code != 0 {
		return fmt.Errorf("send: code %d %s", resp.Code, resp.Remark)
	}
	if !p.tx {
		return nil
	}
	offsetMsgID := resp.ExtFields["msgId"]
	if len(offsetMsgID) < 16 {
		return fmt.Errorf("send: offsetMsgId %q", offsetMsgID)
	}
	commitLogOffset, err := strconv.ParseUint(offsetMsgID[len(offsetMsgID)-16:], 16, 64)
	if err != nil {
		return fmt.Errorf("send: offsetMsgId %q: %w", offsetMsgID, err)
	}
	end := []string{
		"producerGroup", p.group, "tranStateTableOffset", resp.ExtFields["queueOffset"],
		"commitLogOffset", strconv.FormatUint(commitLogOffset, 10), "commitOrRollback", strconv.Itoa(commitType),
		"fromTransactionCheck", "false", "msgId", key,
	}
	if tid, ok := resp.ExtFields["transactionId"]; ok {
		end = append(end, "transactionId", tid)
	}
	return p.k.oneway(codeEndTx, end)
}

func (p *producer) stored() (int64, error) {
	var total int64
	for q := 0; q < p.queues; q++ {
		resp, err := p.k.call(codeGetMaxOffset, []string{"topic", p.topic, "queueId", strconv.Itoa(q)}, nil, 5*time.Second)
		if err != nil {
			return 0, err
		}
		if resp.Code != 0 {
			return 0, fmt.Errorf("max offset: code %d %s", resp.Code, resp.Remark)
		}
		offset, err := strconv.ParseInt(resp.ExtFields["offset"], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("max offset %q: %w", resp.ExtFields["offset"], err)
		}
		total += offset
	}
	return total, nil
}

// waitStored reads the topic's stored count (the sum of its queues' max offsets) until it reaches expected, for at
// most 30 s after since.
func (p *producer) waitStored(expected int64, since time.Time) (int64, error) {
	now, err := p.stored()
	for err == nil && now < expected && time.Since(since) < 30*time.Second {
		time.Sleep(5 * time.Millisecond)
		now, err = p.stored()
	}
	return now, err
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func main() {
	mode := flag.String("mode", "publish", "publish or tx")
	namesrv := flag.String("namesrv", "127.0.0.1:9876", "name server")
	topic := flag.String("topic", "", "topic (it must exist)")
	group := flag.String("group", "", "producer group")
	inflight := flag.Int("inflight", 1, "workers, each with one message in flight")
	seconds := flag.Float64("seconds", 10, "length of the window")
	size := flag.Int("size", 1024, "body bytes")
	warmup := flag.Int("warmup", 200, "messages sent before the window (route, connection, the broker's first use)")
	flag.Parse()
	if os.Getenv("GOMAXPROCS") == "" {
		// One thread runs every worker and the reader: on a two-core machine shared with the broker, handing
		// goroutines between threads (futex wake-ups, spinning) cost a third more CPU per transaction.
		runtime.GOMAXPROCS(1)
	}
	if err := run(*mode, *namesrv, *topic, *group, *inflight, *seconds, *size, *warmup); err != nil {
		fmt.Fprintln(os.Stderr, "txmq-loadgen:", err)
		os.Exit(1)
	}
}

func run(mode, namesrv, topic, group string, inflight int, seconds float64, size, warmup int) error {
	if mode != "publish" && mode != "tx" {
		return fmt.Errorf("unknown --mode %q", mode)
	}
	if topic == "" || group == "" || inflight < 1 {
		return errors.New("--topic, --group and --inflight >= 1 are needed")
	}
	addr, _, queues, err := route(namesrv, topic)
	if err != nil {
		return err
	}
	if queues < 1 {
		return fmt.Errorf("topic %s has no write queue", topic)
	}
	k, err := dial(addr)
	if err != nil {
		return err
	}
	defer k.c.Close()
	body := make([]byte, size)
	for i := range body {
		body[i] = 'x'
	}
	start := make([]byte, 10)
	rand.New(rand.NewSource(time.Now().UnixNano())).Read(start)
	p := &producer{k: k, topic: topic, group: group, queues: queues, body: body, tx: mode == "tx",
		keyStart: fmt.Sprintf("%X", start)}
	before, err := p.stored()
	if err != nil {
		return err
	}
	for i := 0; i < warmup; i++ {
		if err := p.one(); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	// The warm-up's last commits are oneway (and an ASYNC_FLUSH broker indexes sends in the background): wait for all
	// of the warm-up in the topic, so that none is counted in the window.
	if before, err = p.waitStored(before+int64(warmup), time.Now()); err != nil {
		return err
	}
	var done, failed atomic.Int64
	latencies := make([][]time.Duration, inflight)
	cpu0 := cpuSeconds()
	t0 := time.Now()
	deadline := t0.Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for w := 0; w < inflight; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, 4096)
			for {
				s := time.Now()
				if !s.Before(deadline) {
					break
				}
				if err := p.one(); err != nil {
					failed.Add(1)
					if k.broken() {
						return
					}
					continue
				}
				done.Add(1)
				mine = append(mine, time.Since(s))
			}
			latencies[w] = mine
		}(w)
	}
	wg.Wait()
	sentAt := time.Now()
	cpu := cpuSeconds() - cpu0
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	p50, p99 := -1.0, -1.0
	if len(all) > 0 {
		p50 = float64(all[len(all)/2]) / 1e6
		p99 = float64(all[min(len(all)-1, len(all)*99/100)]) / 1e6
	}
	// A tx window lasts until its committed copies are stored; a publish window ends at its last answer, and the
	// count waits only for the broker's consume queues (an ASYNC_FLUSH broker fills them in the background).
	now, err := p.waitStored(before+done.Load(), sentAt)
	if err != nil {
		return err
	}
	finished := time.Now()
	if !p.tx {
		finished = sentAt
	}
	elapsed := finished.Sub(t0).Seconds()
	result := map[string]any{
		"event": "result", "mode": mode, "inflight": inflight, "count": done.Load(), "failed": failed.Load(),
		"seconds": elapsed, "rate": float64(done.Load()) / elapsed, "storedAfterSeconds": finished.Sub(sentAt).Seconds(),
		"stored": now - before, "windowSeconds": sentAt.Sub(t0).Seconds(), "p50_ms": p50, "p99_ms": p99,
		"client_cpu_s": cpu, "loadgen": "go",
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
	return nil
}

func (k *conn) broken() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err != nil
}
