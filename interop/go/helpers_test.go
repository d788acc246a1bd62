// Package interop drives an AMQP 0-9-1 broker (RabbitMQ as the reference,
// Lepus as the system under test) through the official Go client,
// github.com/rabbitmq/amqp091-go.
package interop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waitTimeout bounds every blocking receive in the suite.
const waitTimeout = 5 * time.Second

// connWatchdog bounds how long one test may use one connection: a broker
// that never answers a synchronous method (amqp091-go calls have no timeout)
// gets the socket cut, so the blocked call fails instead of hanging the run.
const connWatchdog = 20 * time.Second

// quietPeriod is how long we watch for something that must NOT arrive.
const quietPeriod = 300 * time.Millisecond

// amqpURL is the broker under test, from AMQP_URL.
func amqpURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// parsedURI returns the parsed AMQP_URL.
func parsedURI(t *testing.T) amqp.URI {
	t.Helper()
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatalf("cannot parse AMQP_URL %q: %v", amqpURL(), err)
	}
	return u
}

// dialConfig is amqp.DialConfig with a bounded TCP connect and a connection
// closed when the test ends.
func dialConfig(t *testing.T, url string, cfg amqp.Config) (*amqp.Connection, error) {
	t.Helper()
	if cfg.Dial == nil {
		cfg.Dial = amqp.DefaultDial(waitTimeout)
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err == nil {
		watchdog(t, conn)
		t.Cleanup(func() { _ = conn.Close() })
	}
	return conn, err
}

// watchdog cuts conn's socket if the test still runs after connWatchdog.
func watchdog(t *testing.T, conn *amqp.Connection) {
	timer := time.AfterFunc(connWatchdog, func() {
		_ = conn.CloseDeadline(time.Now())
	})
	t.Cleanup(func() { timer.Stop() })
}

// dial opens a connection to the broker, closed when the test ends.
func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := dialConfig(t, amqpURL(), amqp.Config{})
	if err != nil {
		t.Fatalf("dial %s: %v", amqpURL(), err)
	}
	return conn
}

// openChannel opens a channel on conn, closed when the test ends.
func openChannel(t *testing.T, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// connChannel dials and opens one channel.
func connChannel(t *testing.T) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn := dial(t)
	return conn, openChannel(t, conn)
}

// uniqueName returns a name unique to this run: prefix.<test>.<random>.
func uniqueName(t *testing.T, prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	test := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return "lepus.go." + prefix + "." + test + "." + hex.EncodeToString(b[:])
}

// cleanupQueue deletes a queue on a fresh connection when the test ends.
func cleanupQueue(t *testing.T, name string) {
	t.Cleanup(func() { adminDo(func(ch *amqp.Channel) { _, _ = ch.QueueDelete(name, false, false, false) }) })
}

// cleanupExchange deletes an exchange on a fresh connection when the test ends.
func cleanupExchange(t *testing.T, name string) {
	t.Cleanup(func() { adminDo(func(ch *amqp.Channel) { _ = ch.ExchangeDelete(name, false, false) }) })
}

// adminDo runs f on a short-lived connection (used for cleanup, so errors
// on the test's own channels do not prevent it).
func adminDo(f func(ch *amqp.Channel)) {
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(waitTimeout)})
	if err != nil {
		return
	}
	timer := time.AfterFunc(waitTimeout, func() { _ = conn.CloseDeadline(time.Now()) })
	defer timer.Stop()
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	f(ch)
}

// declareQueue declares a non-durable, uniquely named queue removed at test end.
func declareQueue(t *testing.T, ch *amqp.Channel, prefix string) amqp.Queue {
	t.Helper()
	name := uniqueName(t, prefix)
	q, err := ch.QueueDeclare(name, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue.declare %s: %v", name, err)
	}
	cleanupQueue(t, name)
	return q
}

// declareExchange declares a non-durable, uniquely named exchange removed at test end.
func declareExchange(t *testing.T, ch *amqp.Channel, prefix, kind string, args amqp.Table) string {
	t.Helper()
	name := uniqueName(t, prefix)
	if err := ch.ExchangeDeclare(name, kind, false, false, false, false, args); err != nil {
		t.Fatalf("exchange.declare %s (%s): %v", name, kind, err)
	}
	cleanupExchange(t, name)
	return name
}

// publish sends a text message with a bounded context.
func publish(t *testing.T, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	publishFlags(t, ch, exchange, key, false, msg)
}

// publishFlags publishes; on a channel in confirm mode it also waits for the
// broker's basic.ack, so that later queue counts are deterministic.
func publishFlags(t *testing.T, ch *amqp.Channel, exchange, key string, mandatory bool, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, msg)
	if err != nil {
		t.Fatalf("basic.publish to %q/%q: %v", exchange, key, err)
	}
	if dc == nil {
		return // not in confirm mode
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatalf("waiting for the confirm of a publish to %q/%q: %v", exchange, key, err)
	}
	if !acked {
		t.Fatalf("publish to %q/%q was nacked", exchange, key)
	}
}

// confirmChannel dials and opens a channel in confirm mode: helpers that
// publish on it wait for each basic.ack.
func confirmChannel(t *testing.T) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, ch := connChannel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	return conn, ch
}

// publishText sends a plain text body.
func publishText(t *testing.T, ch *amqp.Channel, exchange, key, body string) {
	t.Helper()
	publish(t, ch, exchange, key, amqp.Publishing{ContentType: "text/plain", Body: []byte(body)})
}

// receive waits for one delivery, failing the test after waitTimeout.
func receive(t *testing.T, msgs <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-msgs:
		if !ok {
			t.Fatalf("delivery channel closed while waiting for a message")
		}
		return d
	case <-time.After(waitTimeout):
		t.Fatalf("no delivery within %s", waitTimeout)
	}
	return amqp.Delivery{}
}

// receiveN waits for n deliveries.
func receiveN(t *testing.T, msgs <-chan amqp.Delivery, n int) []amqp.Delivery {
	t.Helper()
	out := make([]amqp.Delivery, 0, n)
	deadline := time.After(waitTimeout)
	for len(out) < n {
		select {
		case d, ok := <-msgs:
			if !ok {
				t.Fatalf("delivery channel closed after %d of %d messages", len(out), n)
			}
			out = append(out, d)
		case <-deadline:
			t.Fatalf("received %d of %d messages within %s", len(out), n, waitTimeout)
		}
	}
	return out
}

// expectNoDelivery asserts nothing arrives during quietPeriod.
func expectNoDelivery(t *testing.T, msgs <-chan amqp.Delivery) {
	t.Helper()
	select {
	case d, ok := <-msgs:
		if ok {
			t.Fatalf("unexpected delivery %q (tag %d)", d.Body, d.DeliveryTag)
		}
	case <-time.After(quietPeriod):
	}
}

// bodies returns the bodies of deliveries as strings.
func bodies(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Body)
	}
	return out
}

// consume starts a consumer with a server-generated tag.
func consume(t *testing.T, ch *amqp.Channel, queue string, autoAck bool) <-chan amqp.Delivery {
	t.Helper()
	msgs, err := ch.Consume(queue, "", autoAck, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume %s: %v", queue, err)
	}
	return msgs
}

// fenceGet is a basic.get (auto-ack) used as a fence: the queue answers it after every delivery it
// already dispatched on this channel, so a delivery past a prefetch limit has either taken the
// message get-ok names or changed the count it reports. It checks both against the expected ones.
func fenceGet(t *testing.T, ch *amqp.Channel, queue, wantBody string, wantRemaining int) {
	t.Helper()
	d := getOne(t, ch, queue, true)
	if string(d.Body) != wantBody || int(d.MessageCount) != wantRemaining {
		t.Fatalf("fence on %s: got %q with %d left, want %q with %d left (one delivery too many or too few)",
			queue, d.Body, d.MessageCount, wantBody, wantRemaining)
	}
}

// getOne does basic.get and fails if the queue was empty.
func getOne(t *testing.T, ch *amqp.Channel, queue string, autoAck bool) amqp.Delivery {
	t.Helper()
	d, ok, err := ch.Get(queue, autoAck)
	if err != nil {
		t.Fatalf("basic.get %s: %v", queue, err)
	}
	if !ok {
		t.Fatalf("basic.get %s: get-empty, expected a message", queue)
	}
	return d
}

// asAMQPError extracts an *amqp.Error or fails.
func asAMQPError(t *testing.T, err error) *amqp.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an AMQP error, got success")
	}
	var e *amqp.Error
	if !errors.As(err, &e) {
		t.Fatalf("expected *amqp.Error, got %T: %v", err, err)
	}
	return e
}

// expectChannelError asserts err is a channel-level (soft) error with code,
// whose reply text starts with textPrefix, and that the broker closed the
// channel (NotifyClose on the channel) but not the connection.
func expectChannelError(t *testing.T, conn *amqp.Connection, ch *amqp.Channel, chClosed <-chan *amqp.Error, err error, code int, textPrefix string) *amqp.Error {
	t.Helper()
	e := asAMQPError(t, err)
	if e.Code != code {
		t.Fatalf("reply code: want %d, got %d (%s)", code, e.Code, e.Reason)
	}
	if !strings.HasPrefix(e.Reason, textPrefix) {
		t.Fatalf("reply text: want prefix %q, got %q", textPrefix, e.Reason)
	}
	if !e.Server {
		t.Fatalf("error was not sent by the server: %v", e)
	}
	t.Logf("channel error %d %q", e.Code, e.Reason)
	if chClosed != nil {
		select {
		case ce, ok := <-chClosed:
			if !ok || ce == nil {
				t.Fatalf("channel NotifyClose closed without an error")
			}
			if ce.Code != code {
				t.Fatalf("channel close code: want %d, got %d", code, ce.Code)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("channel was not closed within %s", waitTimeout)
		}
	}
	if !ch.IsClosed() {
		t.Fatalf("channel should be closed after a %d error", code)
	}
	if conn.IsClosed() {
		t.Fatalf("connection should stay open after a channel error %d", code)
	}
	// The connection must still be usable.
	ch2, err2 := conn.Channel()
	if err2 != nil {
		t.Fatalf("connection unusable after channel error: %v", err2)
	}
	_ = ch2.Close()
	return e
}

// expectConnectionError asserts err is a connection-level (hard) error with
// code and textPrefix, and that the connection was closed (NotifyClose).
func expectConnectionError(t *testing.T, conn *amqp.Connection, connClosed <-chan *amqp.Error, err error, code int, textPrefix string) *amqp.Error {
	t.Helper()
	e := asAMQPError(t, err)
	if e.Code != code {
		t.Fatalf("reply code: want %d, got %d (%s)", code, e.Code, e.Reason)
	}
	if !strings.HasPrefix(e.Reason, textPrefix) {
		t.Fatalf("reply text: want prefix %q, got %q", textPrefix, e.Reason)
	}
	t.Logf("connection error %d %q", e.Code, e.Reason)
	select {
	case ce, ok := <-connClosed:
		if !ok || ce == nil {
			t.Fatalf("connection NotifyClose closed without an error")
		}
		if ce.Code != code {
			t.Fatalf("connection close code: want %d, got %d (%s)", code, ce.Code, ce.Reason)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("connection was not closed within %s", waitTimeout)
	}
	if !conn.IsClosed() {
		t.Fatalf("connection should be closed after a %d error", code)
	}
	return e
}

// queueExists checks with a passive declare on a fresh connection.
func queueExists(name string) bool {
	exists := false
	adminDo(func(ch *amqp.Channel) {
		_, err := ch.QueueDeclarePassive(name, false, false, false, false, nil)
		exists = err == nil
	})
	return exists
}

// exchangeExists checks with a passive declare on a fresh connection.
func exchangeExists(name string) bool {
	exists := false
	adminDo(func(ch *amqp.Channel) {
		exists = ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil) == nil
	})
	return exists
}

// publishMandatory sends a text body with mandatory=true.
func publishMandatory(t *testing.T, ch *amqp.Channel, exchange, key, body string) {
	t.Helper()
	publishFlags(t, ch, exchange, key, true, amqp.Publishing{ContentType: "text/plain", Body: []byte(body)})
}

// waitChannelClosed waits for a channel's NotifyClose to report a server error.
func waitChannelClosed(t *testing.T, closed <-chan *amqp.Error) *amqp.Error {
	t.Helper()
	select {
	case e, ok := <-closed:
		if !ok || e == nil {
			t.Fatalf("channel closed without an error")
		}
		if !e.Server {
			t.Fatalf("channel closed by the client, not the server: %v", e)
		}
		t.Logf("channel closed by the server: %d %q", e.Code, e.Reason)
		return e
	case <-time.After(waitTimeout):
		t.Fatalf("channel was not closed by the server within %s", waitTimeout)
	}
	return nil
}

// waitUntil polls cond every 20 ms until it holds or waitTimeout passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", waitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMessageCount polls the ready-message count until it equals want, for
// changes the broker makes asynchronously (requeues after nack/reject or a
// channel close).
func waitMessageCount(t *testing.T, ch *amqp.Channel, queue string, want int) {
	t.Helper()
	last := -1
	deadline := time.Now().Add(waitTimeout)
	for {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("passive declare %s: %v", queue, err)
		}
		if q.Messages == want {
			return
		}
		last = q.Messages
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: want %d messages, still %d after %s", queue, want, last, waitTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectQueueStaysEmpty asserts that, after a quiet period, the queue has no
// ready messages and basic.get finds nothing.
func expectQueueStaysEmpty(t *testing.T, ch *amqp.Channel, queue string) {
	t.Helper()
	time.Sleep(quietPeriod)
	assertMessageCount(t, ch, queue, 0)
	if d, ok, err := ch.Get(queue, true); err != nil || ok {
		t.Fatalf("queue %s should be empty, basic.get returned ok=%v body=%q err=%v", queue, ok, d.Body, err)
	}
}

// assertMessageCount checks the ready-message count with a passive declare.
func assertMessageCount(t *testing.T, ch *amqp.Channel, queue string, want int) {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", queue, err)
	}
	if q.Messages != want {
		t.Fatalf("queue %s: want %d messages, got %d", queue, want, q.Messages)
	}
}
