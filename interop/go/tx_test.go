package interop

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// tx.select + tx.commit: published messages appear only at commit.
func TestTxCommitPublishes(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "tx.commit")
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	publishText(t, ch, "", q.Name, "one")
	publishText(t, ch, "", q.Name, "two")
	// Fence: the queue answers a passive declare from the tx channel after everything that channel
	// sent it before, so an uncommitted publish that leaked into the queue would be counted.
	if got, err := ch.QueueInspect(q.Name); err != nil || got.Messages != 0 {
		t.Fatalf("before commit, on the tx channel: %+v %v (want 0 messages)", got, err)
	}
	observer := openChannel(t, conn)
	if got, err := observer.QueueInspect(q.Name); err != nil || got.Messages != 0 {
		t.Fatalf("before commit: %+v %v (want 0 messages)", got, err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	assertMessageCount(t, observer, q.Name, 2)
	msgs := consume(t, observer, q.Name, true)
	if got := bodies(receiveN(t, msgs, 2)); strings.Join(got, ",") != "one,two" {
		t.Fatalf("got %v", got)
	}
}

// tx.rollback discards the publishes of the transaction; the channel stays
// transactional and the next commit works.
func TestTxRollbackDiscardsPublishes(t *testing.T) {
	_, ch := connChannel(t)
	q := declareQueue(t, ch, "tx.rollback")
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	publishText(t, ch, "", q.Name, "rolled back")
	if err := ch.TxRollback(); err != nil {
		t.Fatalf("tx.rollback: %v", err)
	}
	assertMessageCount(t, ch, q.Name, 0)
	publishText(t, ch, "", q.Name, "committed")
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	assertMessageCount(t, ch, q.Name, 1)
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "committed" {
		t.Fatalf("got %q", d.Body)
	}
}

// Acks inside a transaction take effect at commit; rolled-back acks leave
// the message unacknowledged (requeued when the channel closes).
func TestTxAckCommitAndRollback(t *testing.T) {
	conn, setup := confirmChannel(t)
	q := declareQueue(t, setup, "tx.ack")
	publishText(t, setup, "", q.Name, "a")
	publishText(t, setup, "", q.Name, "b")

	ch := openChannel(t, conn)
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	a := getOne(t, ch, q.Name, false)
	b := getOne(t, ch, q.Name, false)
	if err := a.Ack(false); err != nil {
		t.Fatalf("ack a: %v", err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	if err := b.Ack(false); err != nil {
		t.Fatalf("ack b: %v", err)
	}
	if err := ch.TxRollback(); err != nil {
		t.Fatalf("tx.rollback: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// a was acked and committed; b's ack was rolled back, so b is requeued.
	waitMessageCount(t, setup, q.Name, 1)
	d := getOne(t, setup, q.Name, true)
	if string(d.Body) != "b" || !d.Redelivered {
		t.Fatalf("want b redelivered, got %q redelivered=%v", d.Body, d.Redelivered)
	}
}

// tx.commit on a channel that is not transactional: 406.
func TestTxCommitWithoutSelectIs406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.TxCommit()
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.Contains(e.Reason, "not transactional") {
		t.Fatalf("reply text should say the channel is not transactional: %q", e.Reason)
	}
}

// tx.rollback on a channel that is not transactional: 406.
func TestTxRollbackWithoutSelectIs406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.TxRollback()
	expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
}

// confirm.select on a transactional channel: 406.
func TestConfirmSelectOnTxChannelIs406(t *testing.T) {
	conn, ch := connChannel(t)
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.Confirm(false)
	expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
}

// tx.select on a channel in confirm mode: 406.
func TestTxSelectOnConfirmChannelIs406(t *testing.T) {
	conn, ch := confirmChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.Tx()
	expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
}
