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
