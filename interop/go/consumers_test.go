package interop

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// x-single-active-consumer: only the earliest subscriber gets messages; when
// its connection goes, the next takes over with the unacked messages first,
// in order and marked redelivered (RabbitMQ 3.10.8's classic queues).
func TestSingleActiveConsumerFailsOverWhenItsConnectionCloses(t *testing.T) {
	_, ch := confirmChannel(t)
	name := uniqueName(t, "sac")
	if _, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{"x-single-active-consumer": true}); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	cleanupQueue(t, name)

	activeConn, activeCh := connChannel(t)
	active, err := activeCh.Consume(name, "active", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume (active): %v", err)
	}
	_, waitingCh := connChannel(t)
	waiting, err := waitingCh.Consume(name, "waiting", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume (waiting): %v", err)
	}
	for i := 0; i < 4; i++ {
		publishText(t, ch, "", name, fmt.Sprint(i))
	}
	got := receiveN(t, active, 4)
	if want := []string{"0", "1", "2", "3"}; !reflect.DeepEqual(bodies(got), want) {
		t.Fatalf("active consumer: want %v, got %v", want, bodies(got))
	}
	expectNoDelivery(t, waiting)

	// Unacked, then the active consumer's connection closes.
	_ = activeConn.Close()
	requeued := receiveN(t, waiting, 4)
	if want := []string{"0", "1", "2", "3"}; !reflect.DeepEqual(bodies(requeued), want) {
		t.Fatalf("after failover: want %v in order, got %v", want, bodies(requeued))
	}
	for _, d := range requeued {
		if !d.Redelivered {
			t.Fatalf("requeued message %q not marked redelivered", d.Body)
		}
		_ = d.Ack(false)
	}
}

// A non-boolean x-single-active-consumer is a 406 naming the type, as RabbitMQ answers.
func TestSingleActiveConsumerNonBooleanIs406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "sac-bad")
	_, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{"x-single-active-consumer": "yes"})
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.HasSuffix(e.Reason, "{unacceptable_type,longstr}") {
		t.Fatalf("reply text: %q", e.Reason)
	}
}

// x-max-priority: basic.get takes higher priorities first, first in first
// out within one, and a priority above the maximum counts as the maximum.
func TestPriorityQueueDeliversHigherPrioritiesFirst(t *testing.T) {
	_, ch := confirmChannel(t)
	name := uniqueName(t, "priority")
	if _, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{"x-max-priority": int32(5)}); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	cleanupQueue(t, name)
	published := []struct {
		body     string
		priority uint8
	}{{"a0", 0}, {"c5", 5}, {"d1", 1}, {"h9", 9}, {"e5", 5}, {"g2", 2}}
	for _, p := range published {
		publish(t, ch, "", name, amqp.Publishing{Body: []byte(p.body), Priority: p.priority})
	}
	var got []string
	for range published {
		d, ok, err := ch.Get(name, true)
		if err != nil || !ok {
			t.Fatalf("basic.get: ok=%v err=%v", ok, err)
		}
		got = append(got, string(d.Body))
	}
	if want := []string{"c5", "h9", "e5", "g2", "d1", "a0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("delivery order: want %v, got %v", want, got)
	}
}

// x-max-priority above 255 is a 406 with RabbitMQ's reason.
func TestPriorityAbove255Is406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "priority-bad")
	_, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{"x-max-priority": int32(256)})
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.HasSuffix(e.Reason, "{max_value_exceeded,256}") {
		t.Fatalf("reply text: %q", e.Reason)
	}
}

// consumerTimeoutMs is the consumer timeout the consumer-timeout test gives its broker.
const consumerTimeoutMs = 2000

// withConsumerTimeout gives a broker whose consumer_timeout is consumerTimeoutMs (both brokers
// default to RabbitMQ's 30 minutes, too long for a test) and returns its URL. RabbitMQ: the node's
// consumer_timeout and channel_tick_interval (how often a channel checks its oldest unacked
// delivery, a minute by default; read by each channel, the timeout when it opens) are set through
// rabbitmqctl eval, as RabbitMQ's own consumer_timeout tests do, and put back when the test ends.
// Lepus: a private broker started with LEPUS_CONSUMER_TIMEOUT_MS (--consumer-timeout-ms).
func withConsumerTimeout(t *testing.T) string {
	t.Helper()
	if brokerProduct(t) == "Lepus" {
		// No stream listener: the default 5552 may be another broker's.
		return startLepus(t, fmt.Sprint("LEPUS_CONSUMER_TIMEOUT_MS=", consumerTimeoutMs))
	}
	get := func(key string) string {
		out := strings.TrimSpace(rabbitmqctl(t, "eval", "application:get_env(rabbit, "+key+")."))
		value := strings.TrimSuffix(strings.TrimPrefix(out, "{ok,"), "}")
		if value == out || value == "" || strings.Trim(value, "0123456789") != "" {
			t.Fatalf("rabbit's %s is %q, not an integer", key, out)
		}
		return value
	}
	set := func(timeout, tick string) {
		rabbitmqctl(t, "eval", "application:set_env(rabbit, consumer_timeout, "+timeout+
			"), application:set_env(rabbit, channel_tick_interval, "+tick+").")
	}
	timeout, tick := get("consumer_timeout"), get("channel_tick_interval")
	t.Logf("the node's consumer_timeout %s ms, channel_tick_interval %s ms; %d and 1000 for this test", timeout, tick, consumerTimeoutMs)
	set(fmt.Sprint(consumerTimeoutMs), "1000")
	t.Cleanup(func() { set(timeout, tick) })
	return amqpURL()
}

// A delivery left unacked longer than consumer_timeout closes its channel with 406 and RabbitMQ's
// text naming the channel and the timeout (not before the timeout); the message goes back to the
// queue, redelivered; another channel of the connection that acks in time stays open, and so does
// the connection.
func TestConsumerTimeoutClosesTheChannelOfAnUnackedDeliveryWith406(t *testing.T) {
	url := withConsumerTimeout(t)
	conn, err := dialConfig(t, url, amqp.Config{})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	slow := openChannel(t, conn) // channel 1, the first this connection opens
	quick := openChannel(t, conn)
	// Exclusive queues: gone with the connection, on whichever broker this is.
	slowQueue, err := slow.QueueDeclare(uniqueName(t, "consumer-timeout-slow"), false, false, true, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	quickQueue, err := quick.QueueDeclare(uniqueName(t, "consumer-timeout-quick"), false, false, true, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	slowClosed := slow.NotifyClose(make(chan *amqp.Error, 1))
	quickClosed := quick.NotifyClose(make(chan *amqp.Error, 1))
	publishText(t, quick, "", slowQueue.Name, "held")
	slowDeliveries := consume(t, slow, slowQueue.Name, false)
	quickDeliveries := consume(t, quick, quickQueue.Name, false)
	held := receive(t, slowDeliveries)
	delivered := time.Now()
	if string(held.Body) != "held" || held.Redelivered {
		t.Fatalf("got %q (redelivered %v), want a first delivery of held", held.Body, held.Redelivered)
	}
	// The quick consumer acks everything at once, every 200 ms, until the slow channel closes.
	var closed *amqp.Error
	deadline := time.After(15 * time.Second)
	for sent := 0; closed == nil; sent++ {
		publishText(t, quick, "", quickQueue.Name, fmt.Sprint("quick-", sent))
		if err := receive(t, quickDeliveries).Ack(false); err != nil {
			t.Fatalf("basic.ack on the quick channel: %v", err)
		}
		select {
		case closed = <-slowClosed:
			if closed == nil {
				t.Fatalf("the slow channel's NotifyClose closed without an error")
			}
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the channel holding an unacked delivery for %s was not closed (consumer_timeout %d ms)",
				time.Since(delivered).Round(time.Millisecond), consumerTimeoutMs)
		}
	}
	elapsed := time.Since(delivered)
	want := fmt.Sprintf("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: %d ms. "+
		"This timeout value can be configured, see consumers doc guide to learn more", consumerTimeoutMs)
	if closed.Code != amqp.PreconditionFailed || closed.Reason != want || !closed.Server {
		t.Fatalf("channel closed with %d %q (server %v), want 406 %q", closed.Code, closed.Reason, closed.Server, want)
	}
	if elapsed < consumerTimeoutMs*time.Millisecond*95/100 {
		t.Fatalf("closed %s after the delivery, before the %d ms timeout", elapsed, consumerTimeoutMs)
	}
	t.Logf("closed %s after the delivery", elapsed.Round(time.Millisecond))
	select {
	case e := <-quickClosed:
		t.Fatalf("the channel that acked in time was closed: %v", e)
	default:
	}
	if conn.IsClosed() {
		t.Fatalf("the connection was closed, not only the channel")
	}
	waitMessageCount(t, quick, slowQueue.Name, 1)
	if d := getOne(t, quick, slowQueue.Name, true); string(d.Body) != "held" || !d.Redelivered {
		t.Fatalf("got %q (redelivered %v), want held back in the queue, redelivered", d.Body, d.Redelivered)
	}
}
