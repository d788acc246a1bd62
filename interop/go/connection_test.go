package interop

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// connection.start: server properties carry the capabilities table with
// every capability RabbitMQ advertises as true.
func TestConnectionServerCapabilities(t *testing.T) {
	conn := dial(t)
	if conn.Major != 0 || conn.Minor != 9 {
		t.Fatalf("protocol version: want 0-9, got %d-%d", conn.Major, conn.Minor)
	}
	caps, ok := conn.Properties["capabilities"].(amqp.Table)
	if !ok {
		t.Fatalf("server properties have no capabilities table: %#v", conn.Properties)
	}
	for _, name := range []string{
		"publisher_confirms",
		"exchange_exchange_bindings",
		"basic.nack",
		"consumer_cancel_notify",
		"connection.blocked",
		"consumer_priorities",
		"authentication_failure_close",
		"per_consumer_qos",
	} {
		if v, ok := caps[name].(bool); !ok || !v {
			t.Errorf("capability %q: want true, got %#v", name, caps[name])
		}
	}
	for _, key := range []string{"product", "version", "platform"} {
		if s, ok := conn.Properties[key].(string); !ok || s == "" {
			t.Errorf("server property %q should be a non-empty string, got %#v", key, conn.Properties[key])
		}
	}
}

// connection.start-ok with the PLAIN mechanism (the default) and the
// negotiated defaults RabbitMQ hands out in connection.tune.
func TestConnectionPlainDefaultsNegotiated(t *testing.T) {
	conn := dial(t)
	if got := conn.Config.SASL[0].Mechanism(); got != "PLAIN" {
		t.Fatalf("mechanism: want PLAIN, got %s", got)
	}
	// Client asks for 2047 channels and 128 KiB frames by default; RabbitMQ
	// offers channel_max 2047 and frame_max 131072.
	if conn.Config.ChannelMax != 2047 {
		t.Errorf("channel_max: want 2047, got %d", conn.Config.ChannelMax)
	}
	if conn.Config.FrameSize != 131072 {
		t.Errorf("frame_max: want 131072, got %d", conn.Config.FrameSize)
	}
	if conn.Config.Vhost != parsedURI(t).Vhost {
		t.Errorf("vhost: want %q, got %q", parsedURI(t).Vhost, conn.Config.Vhost)
	}
}

// connection.start-ok with the AMQPLAIN mechanism.
func TestConnectionAMQPLAIN(t *testing.T) {
	u := parsedURI(t)
	conn, err := dialConfig(t, amqpURL(), amqp.Config{
		SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: u.Username, Password: u.Password}},
	})
	if err != nil {
		t.Fatalf("AMQPLAIN dial: %v", err)
	}
	if got := conn.Config.SASL[0].Mechanism(); got != "AMQPLAIN" {
		t.Fatalf("mechanism: want AMQPLAIN, got %s", got)
	}
	ch := openChannel(t, conn)
	q := declareQueue(t, ch, "amqplain")
	publishText(t, ch, "", q.Name, "via amqplain")
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "via amqplain" {
		t.Fatalf("got %q", d.Body)
	}
}

// A wrong password is refused. amqp091-go does not advertise
// authentication_failure_close, so RabbitMQ closes the socket (after a 3 s
// delay) without connection.close and the client reports ErrCredentials
// (403); a broker that sends connection.close 403 ACCESS_REFUSED passes too.
func TestConnectionWrongPasswordRefused(t *testing.T) {
	t.Parallel() // slow: runs alongside the other slow tests
	u := parsedURI(t)
	u.Password = "definitely-not-" + u.Password
	_, err := dialConfig(t, u.String(), amqp.Config{})
	e := asAMQPError(t, err)
	if e.Code != amqp.AccessRefused {
		t.Fatalf("want 403 ACCESS_REFUSED / ErrCredentials, got %d %q", e.Code, e.Reason)
	}
}

// The same with AMQPLAIN.
func TestConnectionWrongPasswordRefusedAMQPLAIN(t *testing.T) {
	t.Parallel() // slow: runs alongside the other slow tests
	u := parsedURI(t)
	_, err := dialConfig(t, amqpURL(), amqp.Config{
		SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: u.Username, Password: "wrong-" + u.Password}},
	})
	e := asAMQPError(t, err)
	if e.Code != amqp.AccessRefused {
		t.Fatalf("want 403 ACCESS_REFUSED / ErrCredentials, got %d %q", e.Code, e.Reason)
	}
}

// connection.open to a vhost that does not exist: connection.close 530
// NOT_ALLOWED sent by the server.
func TestConnectionUnknownVhostIs530(t *testing.T) {
	u := parsedURI(t)
	u.Vhost = uniqueName(t, "no-such-vhost")
	_, err := dialConfig(t, u.String(), amqp.Config{})
	e := asAMQPError(t, err)
	if e.Code != amqp.NotAllowed || !e.Server {
		t.Fatalf("want server error 530, got %d %q (server=%v)", e.Code, e.Reason, e.Server)
	}
	if !strings.HasPrefix(e.Reason, "NOT_ALLOWED") || !strings.Contains(e.Reason, u.Vhost) {
		t.Fatalf("reply text should start with NOT_ALLOWED and name the vhost, got %q", e.Reason)
	}
}

// connection.tune: heartbeat 1 s negotiated; with heartbeats flowing the
// connection survives 4 s of application idleness.
func TestConnectionHeartbeatKeepsIdleConnectionAlive(t *testing.T) {
	t.Parallel() // slow: runs alongside the other slow tests
	conn, err := dialConfig(t, amqpURL(), amqp.Config{Heartbeat: time.Second})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if conn.Config.Heartbeat != time.Second {
		t.Fatalf("negotiated heartbeat: want 1s, got %s", conn.Config.Heartbeat)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	select {
	case e := <-closed:
		t.Fatalf("connection closed while idle: %v", e)
	case <-time.After(4 * time.Second):
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed while idle")
	}
	ch := openChannel(t, conn)
	q := declareQueue(t, ch, "heartbeat")
	publishText(t, ch, "", q.Name, "still alive")
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "still alive" {
		t.Fatalf("got %q", d.Body)
	}
}

// connection.tune / tune-ok: values lower than the server's win.
func TestConnectionTuneClientLimitsNegotiated(t *testing.T) {
	conn, err := dialConfig(t, amqpURL(), amqp.Config{ChannelMax: 10, FrameSize: 8192, Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if conn.Config.ChannelMax != 10 || conn.Config.FrameSize != 8192 || conn.Config.Heartbeat != 5*time.Second {
		t.Fatalf("negotiated: want channel_max 10 frame_max 8192 heartbeat 5s, got %d %d %s",
			conn.Config.ChannelMax, conn.Config.FrameSize, conn.Config.Heartbeat)
	}
	// The small frame size really is used: a 100 KB body spans many frames.
	ch := openChannel(t, conn)
	q := declareQueue(t, ch, "smallframes")
	body := []byte(strings.Repeat("0123456789", 10000))
	publish(t, ch, "", q.Name, amqp.Publishing{Body: body})
	if d := getOne(t, ch, q.Name, true); string(d.Body) != string(body) {
		t.Fatalf("body of %d bytes came back as %d bytes", len(body), len(d.Body))
	}
	// Channel ids 1..10 are usable (1 is already open).
	for i := 2; i <= 10; i++ {
		c, err := conn.Channel()
		if err != nil {
			t.Fatalf("channel %d of 10: %v", i, err)
		}
		defer c.Close()
	}
}

// connection.tune: values above the server's limits are capped by the
// server's channel_max (2047) and frame_max (131072).
func TestConnectionTuneServerLimitsNegotiated(t *testing.T) {
	conn, err := dialConfig(t, amqpURL(), amqp.Config{ChannelMax: 5000, FrameSize: 1 << 20})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if conn.Config.ChannelMax != 2047 || conn.Config.FrameSize != 131072 {
		t.Fatalf("negotiated: want channel_max 2047 frame_max 131072, got %d %d",
			conn.Config.ChannelMax, conn.Config.FrameSize)
	}
}

// connection.blocked / unblocked under a real memory alarm: a connection that publishes is told
// it is blocked, with RabbitMQ's reason, and unblocked when the alarm clears.
func TestConnectionBlockedByMemoryAlarm(t *testing.T) {
	url, clearAlarm := withMemoryAlarm(t)
	conn, err := dialConfig(t, url, amqp.Config{})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 2))
	ch := openChannel(t, conn)
	q := declareQueue(t, ch, "blocked")
	// A blocked connection is not read, so it would never get close-ok: cut it instead (cleanups
	// run last-in first-out, so this runs before the channel's and the connection's Close).
	t.Cleanup(func() { _ = conn.CloseDeadline(time.Now()) })
	// Only a connection that publishes is blocked; the publish itself waits for the alarm.
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("held back")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case b := <-blocked:
		if !b.Active || b.Reason != "low on memory" {
			t.Fatalf("want connection.blocked \"low on memory\", got %+v", b)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no connection.blocked within %s under a memory alarm", waitTimeout)
	}
	if clearAlarm == nil {
		return
	}
	clearAlarm()
	select {
	case b := <-blocked:
		if b.Active {
			t.Fatalf("want connection.unblocked, got %+v", b)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no connection.unblocked within %s of clearing the alarm", waitTimeout)
	}
	waitMessageCount(t, ch, q.Name, 1)
}

// connection.close from the client: close-ok, every channel ends, the
// delivery channel is closed and NotifyClose is closed without an error.
func TestConnectionCloseGraceful(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "close")
	msgs := consume(t, ch, q.Name, true)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if err := conn.Close(); err != nil {
		t.Fatalf("connection.close: %v", err)
	}
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			t.Fatalf("graceful close reported an error: %v", e)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("NotifyClose not closed")
	}
	select {
	case _, ok := <-msgs:
		if ok {
			t.Fatalf("delivery after close")
		}
	case <-time.After(waitTimeout):
		t.Fatalf("delivery channel not closed after connection close")
	}
	if !ch.IsClosed() {
		t.Fatalf("channel still open after connection close")
	}
}

// Many channels on one connection used concurrently: 50 goroutines, each
// with its own channel and queue, publish and consume 200 messages.
func TestManyConcurrentChannels(t *testing.T) {
	conn := dial(t)
	const workers, perWorker = 50, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	queues := make([]string, workers)
	for i := range queues {
		queues[i] = uniqueName(t, fmt.Sprintf("many.%d", i))
		cleanupQueue(t, queues[i])
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- channelWorker(conn, queues[w], w, perWorker)
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func channelWorker(conn *amqp.Connection, queue string, w, n int) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("worker %d: channel: %w", w, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		return fmt.Errorf("worker %d: declare: %w", w, err)
	}
	msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("worker %d: consume: %w", w, err)
	}
	for i := 0; i < n; i++ {
		err := ch.Publish("", queue, false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("%d:%d", w, i))})
		if err != nil {
			return fmt.Errorf("worker %d: publish %d: %w", w, i, err)
		}
	}
	deadline := time.After(20 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case d, ok := <-msgs:
			if !ok {
				return fmt.Errorf("worker %d: deliveries closed after %d", w, i)
			}
			if want := fmt.Sprintf("%d:%d", w, i); string(d.Body) != want {
				return fmt.Errorf("worker %d: message %d: want %q, got %q", w, i, want, d.Body)
			}
			if d.DeliveryTag != uint64(i+1) {
				return fmt.Errorf("worker %d: delivery tag %d, want %d", w, d.DeliveryTag, i+1)
			}
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("worker %d: ack: %w", w, err)
			}
		case <-deadline:
			return fmt.Errorf("worker %d: got %d of %d messages", w, i, n)
		}
	}
	return nil
}

// channel.open / channel.close many times on one connection; channel ids
// are reused and the broker keeps up.
func TestChannelOpenCloseRepeatedly(t *testing.T) {
	conn := dial(t)
	for i := 0; i < 200; i++ {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("open channel %d: %v", i, err)
		}
		if err := ch.Close(); err != nil {
			t.Fatalf("close channel %d: %v", i, err)
		}
	}
	ch := openChannel(t, conn)
	q := declareQueue(t, ch, "reopen")
	if q.Messages != 0 {
		t.Fatalf("fresh queue not empty")
	}
}

// channel.flow(active=true) from the client is acknowledged with flow-ok.
func TestChannelFlowActiveTrueAccepted(t *testing.T) {
	conn, ch := connChannel(t)
	if err := ch.Flow(true); err != nil {
		t.Fatalf("channel.flow(true): %v", err)
	}
	q := declareQueue(t, ch, "flow")
	publishText(t, ch, "", q.Name, "after flow")
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "after flow" {
		t.Fatalf("got %q", d.Body)
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed")
	}
}

// channel.flow(active=false) from the client is not implemented by
// RabbitMQ: connection error 540 NOT_IMPLEMENTED, the connection closes.
func TestChannelFlowActiveFalseIs540ConnectionError(t *testing.T) {
	conn, ch := connChannel(t)
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.Flow(false)
	expectConnectionError(t, conn, connClosed, err, amqp.NotImplemented, "NOT_IMPLEMENTED")
}
