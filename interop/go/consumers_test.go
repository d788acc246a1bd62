package interop

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

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
