package interop

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// queue.declare with an empty name: the server names the queue amq.gen-...
func TestQueueDeclareServerNamed(t *testing.T) {
	_, ch := connChannel(t)
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	if !strings.HasPrefix(q.Name, "amq.gen-") {
		t.Fatalf("server-named queue: want amq.gen- prefix, got %q", q.Name)
	}
	if q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("fresh queue: %+v", q)
	}
}

// queue.declare passive on an existing queue returns its counts.
func TestQueueDeclarePassiveReturnsCounts(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "passive")
	for i := 0; i < 3; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	consume(t, ch, q.Name, false) // takes one message (unacked), consumer count 1
	waitUntil(t, "one message is delivered", func() bool {
		p, err := ch.QueueDeclarePassive(q.Name, false, false, false, false, nil)
		return err == nil && p.Messages == 2
	})
	p, err := ch.QueueDeclarePassive(q.Name, true, true, true, false, amqp.Table{"x-ignored": "yes"})
	if err != nil {
		t.Fatalf("passive declare: %v", err)
	}
	if p.Name != q.Name || p.Consumers != 1 {
		t.Fatalf("passive declare-ok: want %s with 1 consumer, got %+v", q.Name, p)
	}
}

// queue.declare passive on a missing queue: channel error 404.
func TestQueueDeclarePassiveMissingIs404(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "missing")
	_, err := ch.QueueDeclarePassive(name, false, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.NotFound, "NOT_FOUND")
	if !strings.Contains(e.Reason, name) {
		t.Fatalf("reply text should name the queue: %q", e.Reason)
	}
}

// QueueInspect reports ready messages and consumers.
func TestQueueInspectCounts(t *testing.T) {
	conn, ch := confirmChannel(t)
	q := declareQueue(t, ch, "inspect")
	for i := 0; i < 5; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	got, err := ch.QueueInspect(q.Name)
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	if got.Messages != 5 || got.Consumers != 0 {
		t.Fatalf("want 5 messages 0 consumers, got %+v", got)
	}
	c2 := openChannel(t, conn)
	if err := c2.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	consume(t, c2, q.Name, false)
	consume(t, c2, q.Name, false)
	waitUntil(t, "two messages are delivered to the two consumers", func() bool {
		got, err = ch.QueueInspect(q.Name)
		return err == nil && got.Messages == 3
	})
	if got.Consumers != 2 {
		t.Fatalf("want 2 consumers, got %+v", got)
	}
}

// queue.purge returns the number of messages removed; unacked ones stay.
func TestQueuePurgeCount(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "purge")
	for i := 0; i < 7; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	d := getOne(t, ch, q.Name, false) // one unacked message is not purged
	n, err := ch.QueuePurge(q.Name, false)
	if err != nil {
		t.Fatalf("queue.purge: %v", err)
	}
	if n != 6 {
		t.Fatalf("purge count: want 6, got %d", n)
	}
	assertMessageCount(t, ch, q.Name, 0)
	if err := d.Reject(true); err != nil {
		t.Fatalf("reject: %v", err)
	}
	if again := getOne(t, ch, q.Name, true); !again.Redelivered {
		t.Fatalf("requeued unacked message should be redelivered")
	}
	n, err = ch.QueuePurge(q.Name, false)
	if err != nil || n != 0 {
		t.Fatalf("purge of empty queue: %d %v", n, err)
	}
}

// queue.delete returns the number of messages deleted and the queue is gone.
func TestQueueDeleteCount(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "delete")
	for i := 0; i < 4; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	n, err := ch.QueueDelete(q.Name, false, false, false)
	if err != nil {
		t.Fatalf("queue.delete: %v", err)
	}
	if n != 4 {
		t.Fatalf("delete count: want 4, got %d", n)
	}
	if queueExists(q.Name) {
		t.Fatalf("queue still exists")
	}
	// Deleting a queue that does not exist is not an error in RabbitMQ.
	if n, err := ch.QueueDelete(q.Name, false, false, false); err != nil || n != 0 {
		t.Fatalf("delete of missing queue: %d %v", n, err)
	}
}

// queue.delete if-unused on a queue with a consumer: 406.
func TestQueueDeleteIfUnusedIs406(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "ifunused")
	c2 := openChannel(t, conn)
	consume(t, c2, q.Name, true)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.QueueDelete(q.Name, true, false, false)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.Contains(e.Reason, "in use") {
		t.Fatalf("reply text should say the queue is in use: %q", e.Reason)
	}
	if !queueExists(q.Name) {
		t.Fatalf("queue deleted despite if-unused")
	}
}

// queue.delete if-empty on a queue with messages: 406.
func TestQueueDeleteIfEmptyIs406(t *testing.T) {
	conn, ch := confirmChannel(t)
	q := declareQueue(t, ch, "ifempty")
	publishText(t, ch, "", q.Name, "keep me")
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.QueueDelete(q.Name, false, true, false)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.Contains(e.Reason, "not empty") {
		t.Fatalf("reply text should say the queue is not empty: %q", e.Reason)
	}
	if !queueExists(q.Name) {
		t.Fatalf("queue deleted despite if-empty")
	}
}

// queue.delete if-unused / if-empty succeed when the condition holds.
func TestQueueDeleteIfUnusedIfEmptySucceed(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "conditions")
	if _, err := ch.QueueDelete(q.Name, true, true, false); err != nil {
		t.Fatalf("delete unused empty queue: %v", err)
	}
	if queueExists(q.Name) {
		t.Fatalf("queue still exists")
	}
}

// queue.declare of an existing queue with a different durable flag: 406.
func TestQueueRedeclareWithOtherDurableIs406(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "redeclare")
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.QueueDeclare(q.Name, true, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.Contains(e.Reason, "durable") {
		t.Fatalf("reply text should name the durable flag: %q", e.Reason)
	}
}

// queue.declare with a reserved amq. name: 403.
func TestQueueDeclareReservedNameIs403(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.QueueDeclare("amq.lepus."+uniqueName(t, "q"), false, false, false, false, nil)
	expectChannelError(t, conn, ch, closed, err, amqp.AccessRefused, "ACCESS_REFUSED")
}

// An exclusive queue is locked to its connection: another connection gets
// 405 RESOURCE_LOCKED; when the owner closes, the queue is deleted.
func TestQueueExclusiveLockedAndGoesWithConnection(t *testing.T) {
	owner, och := connChannel(t)
	q, err := och.QueueDeclare(uniqueName(t, "exclusive"), false, false, true, false, nil)
	if err != nil {
		t.Fatalf("declare exclusive: %v", err)
	}
	cleanupQueue(t, q.Name)

	other, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err = ch.QueueDeclarePassive(q.Name, false, false, true, false, nil)
	e := expectChannelError(t, other, ch, closed, err, amqp.ResourceLocked, "RESOURCE_LOCKED")
	if !strings.Contains(e.Reason, q.Name) {
		t.Fatalf("reply text should name the queue: %q", e.Reason)
	}

	if err := owner.Close(); err != nil {
		t.Fatalf("close owner: %v", err)
	}
	waitUntil(t, "the exclusive queue is deleted with its connection", func() bool { return !queueExists(q.Name) })
}

// An auto-delete queue is deleted when its last consumer is cancelled.
func TestQueueAutoDeleteGoesWithLastConsumer(t *testing.T) {
	_, ch := connChannel(t)
	name := uniqueName(t, "autodelete")
	if _, err := ch.QueueDeclare(name, false, true, false, false, nil); err != nil {
		t.Fatalf("declare auto-delete: %v", err)
	}
	cleanupQueue(t, name)
	if _, err := ch.Consume(name, "c1", true, false, false, false, nil); err != nil {
		t.Fatalf("consume c1: %v", err)
	}
	if _, err := ch.Consume(name, "c2", true, false, false, false, nil); err != nil {
		t.Fatalf("consume c2: %v", err)
	}
	if err := ch.Cancel("c1", false); err != nil {
		t.Fatalf("cancel c1: %v", err)
	}
	if !queueExists(name) {
		t.Fatalf("auto-delete queue deleted while a consumer remains")
	}
	if err := ch.Cancel("c2", false); err != nil {
		t.Fatalf("cancel c2: %v", err)
	}
	waitUntil(t, "the auto-delete queue is deleted after its last consumer", func() bool { return !queueExists(name) })
}

// An auto-delete queue that never had a consumer stays.
func TestQueueAutoDeleteWithoutConsumerStays(t *testing.T) {
	_, ch := connChannel(t)
	name := uniqueName(t, "autodelete.idle")
	if _, err := ch.QueueDeclare(name, false, true, false, false, nil); err != nil {
		t.Fatalf("declare auto-delete: %v", err)
	}
	cleanupQueue(t, name)
	time.Sleep(quietPeriod)
	if !queueExists(name) {
		t.Fatalf("auto-delete queue without consumers was deleted")
	}
}

// queue.unbind stops routing for that key only.
func TestQueueUnbind(t *testing.T) {
	_, ch := confirmChannel(t)
	ex := declareExchange(t, ch, "unbind", "direct", nil)
	q := declareQueue(t, ch, "unbind")
	for _, k := range []string{"a", "b"} {
		if err := ch.QueueBind(q.Name, k, ex, false, nil); err != nil {
			t.Fatalf("bind %s: %v", k, err)
		}
	}
	if err := ch.QueueUnbind(q.Name, "a", ex, nil); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	publishText(t, ch, ex, "a", "via a")
	publishText(t, ch, ex, "b", "via b")
	assertMessageCount(t, ch, q.Name, 1)
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "via b" {
		t.Fatalf("got %q", d.Body)
	}
}

// queue.bind to a missing exchange: 404.
func TestQueueBindMissingExchangeIs404(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "bind404")
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.QueueBind(q.Name, "k", uniqueName(t, "noexchange"), false, nil)
	expectChannelError(t, conn, ch, closed, err, amqp.NotFound, "NOT_FOUND")
}
