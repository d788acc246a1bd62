package interop

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// exchange.bind / exchange.unbind: a message published to the source
// exchange reaches a queue bound to the destination exchange only while the
// exchange-to-exchange binding exists, and only for the bound key.
func TestExchangeBindAndUnbindRoutesBetweenExchanges(t *testing.T) {
	_, ch := connChannel(t)
	src := declareExchange(t, ch, "e2e.src", "direct", nil)
	dst := declareExchange(t, ch, "e2e.dst", "fanout", nil)
	q := declareQueue(t, ch, "e2e")
	if err := ch.QueueBind(q.Name, "", dst, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	if err := ch.ExchangeBind(dst, "green", src, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	msgs := consume(t, ch, q.Name, true)

	publishText(t, ch, src, "green", "via e2e")
	publishText(t, ch, src, "red", "not bound")
	d := receive(t, msgs)
	if string(d.Body) != "via e2e" || d.Exchange != src || d.RoutingKey != "green" {
		t.Fatalf("got %q from exchange %q key %q; want body \"via e2e\" from the source exchange with key green", d.Body, d.Exchange, d.RoutingKey)
	}
	expectNoDelivery(t, msgs)

	if err := ch.ExchangeUnbind(dst, "green", src, false, nil); err != nil {
		t.Fatalf("exchange.unbind: %v", err)
	}
	publishText(t, ch, src, "green", "after unbind")
	expectNoDelivery(t, msgs)

	// Publishing straight to the destination still works.
	publishText(t, ch, dst, "anything", "direct to dst")
	if d := receive(t, msgs); string(d.Body) != "direct to dst" {
		t.Fatalf("got %q", d.Body)
	}
}

// Exchange-to-exchange bindings chain through a topic exchange too.
func TestExchangeBindTopicSourceChain(t *testing.T) {
	_, ch := confirmChannel(t)
	src := declareExchange(t, ch, "e2e.topic", "topic", nil)
	mid := declareExchange(t, ch, "e2e.mid", "direct", nil)
	q := declareQueue(t, ch, "e2e.chain")
	if err := ch.ExchangeBind(mid, "stock.#", src, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	if err := ch.QueueBind(q.Name, "stock.usd.nyse", mid, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	publishText(t, ch, src, "stock.usd.nyse", "one")
	publishText(t, ch, src, "stock.eur", "two") // passes src->mid, no queue binding on mid
	publishText(t, ch, src, "bond.usd.nyse", "three")
	assertMessageCount(t, ch, q.Name, 1)
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "one" {
		t.Fatalf("got %q", d.Body)
	}
}

// exchange.declare passive on a missing exchange: channel error 404
// NOT_FOUND, the channel is closed (NotifyClose), the connection stays.
func TestExchangeDeclarePassiveMissingIs404(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "missing")
	err := ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.NotFound, "NOT_FOUND")
	if !strings.Contains(e.Reason, name) {
		t.Fatalf("reply text should name the exchange: %q", e.Reason)
	}
}

// exchange.declare passive on an existing exchange succeeds, whatever the
// type and flags passed.
func TestExchangeDeclarePassiveExisting(t *testing.T) {
	_, ch := connChannel(t)
	name := declareExchange(t, ch, "passive", "topic", nil)
	if err := ch.ExchangeDeclarePassive(name, "fanout", true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of existing exchange: %v", err)
	}
	if err := ch.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of amq.direct: %v", err)
	}
}

// exchange.declare with a different type than the existing exchange:
// channel error 406 PRECONDITION_FAILED.
func TestExchangeRedeclareWithOtherTypeIs406(t *testing.T) {
	conn, ch := connChannel(t)
	name := declareExchange(t, ch, "redeclare", "direct", nil)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.ExchangeDeclare(name, "fanout", false, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !strings.Contains(e.Reason, "type") {
		t.Fatalf("reply text should mention the type: %q", e.Reason)
	}
}

// exchange.declare of an unknown exchange type: connection error 503
// COMMAND_INVALID.
func TestExchangeDeclareUnknownTypeIs503(t *testing.T) {
	conn, ch := connChannel(t)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "badtype")
	cleanupExchange(t, name)
	err := ch.ExchangeDeclare(name, "no-such-type", false, false, false, false, nil)
	expectConnectionError(t, conn, closed, err, amqp.CommandInvalid, "COMMAND_INVALID")
}

// exchange.declare of a name starting with "amq.": 403 ACCESS_REFUSED.
func TestExchangeDeclareReservedNameIs403(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.ExchangeDeclare("amq.lepus-"+uniqueName(t, "x"), "direct", false, false, false, false, nil)
	expectChannelError(t, conn, ch, closed, err, amqp.AccessRefused, "ACCESS_REFUSED")
}

// exchange.delete if-unused on an exchange with a binding: 406.
func TestExchangeDeleteIfUnusedIs406(t *testing.T) {
	conn, ch := connChannel(t)
	name := declareExchange(t, ch, "inuse", "direct", nil)
	q := declareQueue(t, ch, "inuse")
	if err := ch.QueueBind(q.Name, "k", name, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.ExchangeDelete(name, true, false)
	expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if !exchangeExists(name) {
		t.Fatalf("exchange was deleted despite if-unused")
	}
}

// exchange.delete removes the exchange and its bindings.
func TestExchangeDelete(t *testing.T) {
	_, ch := confirmChannel(t)
	name := declareExchange(t, ch, "delete", "fanout", nil)
	q := declareQueue(t, ch, "delete")
	if err := ch.QueueBind(q.Name, "", name, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		t.Fatalf("exchange.delete: %v", err)
	}
	if exchangeExists(name) {
		t.Fatalf("exchange still exists after delete")
	}
	// Redeclared exchange starts without the old binding.
	if err := ch.ExchangeDeclare(name, "fanout", false, false, false, false, nil); err != nil {
		t.Fatalf("redeclare: %v", err)
	}
	publishText(t, ch, name, "", "lost")
	assertMessageCount(t, ch, q.Name, 0)
}

// An internal exchange cannot be published to (403, channel closed) but
// routes what reaches it through an exchange-to-exchange binding.
func TestExchangeInternal(t *testing.T) {
	conn, ch := connChannel(t)
	front := declareExchange(t, ch, "front", "fanout", nil)
	internal := uniqueName(t, "internal")
	if err := ch.ExchangeDeclare(internal, "fanout", false, false, true, false, nil); err != nil {
		t.Fatalf("declare internal exchange: %v", err)
	}
	cleanupExchange(t, internal)
	q := declareQueue(t, ch, "internal")
	if err := ch.QueueBind(q.Name, "", internal, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	if err := ch.ExchangeBind(internal, "", front, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	publishText(t, ch, front, "", "through front")
	assertMessageCount(t, ch, q.Name, 1)

	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_ = ch.Publish(internal, "", false, false, amqp.Publishing{Body: []byte("direct to internal")})
	e := waitChannelClosed(t, closed)
	if e.Code != amqp.AccessRefused || !strings.HasPrefix(e.Reason, "ACCESS_REFUSED") || !strings.Contains(e.Reason, internal) {
		t.Fatalf("want 403 ACCESS_REFUSED naming the exchange, got %d %q", e.Code, e.Reason)
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed by a channel error")
	}
}

// basic.publish to a missing exchange: asynchronous channel error 404.
func TestPublishToMissingExchangeIs404(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "nowhere")
	publishText(t, ch, name, "k", "lost")
	e := waitChannelClosed(t, closed)
	if e.Code != amqp.NotFound || !strings.HasPrefix(e.Reason, "NOT_FOUND") || !strings.Contains(e.Reason, name) {
		t.Fatalf("want 404 NOT_FOUND naming the exchange, got %d %q", e.Code, e.Reason)
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed by a channel error")
	}
}

// Headers exchange with x-match=all: every listed header must match.
func TestHeadersExchangeMatchAll(t *testing.T) {
	_, ch := connChannel(t)
	ex := declareExchange(t, ch, "headers.all", "headers", nil)
	q := declareQueue(t, ch, "headers.all")
	err := ch.QueueBind(q.Name, "", ex, false, amqp.Table{"x-match": "all", "format": "pdf", "type": "report"})
	if err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "pdf", "type": "report"}, Body: []byte("both")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "pdf", "type": "report", "extra": int32(1)}, Body: []byte("both+extra")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "pdf"}, Body: []byte("one")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "zip", "type": "report"}, Body: []byte("wrong value")})
	publish(t, ch, ex, "", amqp.Publishing{Body: []byte("none")})
	msgs := consume(t, ch, q.Name, true)
	got := bodies(receiveN(t, msgs, 2))
	if strings.Join(got, "|") != "both|both+extra" {
		t.Fatalf("x-match=all delivered %v", got)
	}
	expectNoDelivery(t, msgs)
}

// Headers exchange with x-match=any: one matching header is enough.
func TestHeadersExchangeMatchAny(t *testing.T) {
	_, ch := connChannel(t)
	ex := declareExchange(t, ch, "headers.any", "headers", nil)
	q := declareQueue(t, ch, "headers.any")
	err := ch.QueueBind(q.Name, "", ex, false, amqp.Table{"x-match": "any", "format": "pdf", "type": "report"})
	if err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "pdf", "type": "log"}, Body: []byte("format")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"type": "report"}, Body: []byte("type")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"format": "zip", "type": "log"}, Body: []byte("neither")})
	publish(t, ch, ex, "", amqp.Publishing{Body: []byte("none")})
	msgs := consume(t, ch, q.Name, true)
	got := bodies(receiveN(t, msgs, 2))
	if strings.Join(got, "|") != "format|type" {
		t.Fatalf("x-match=any delivered %v", got)
	}
	expectNoDelivery(t, msgs)
}

// Headers exchange: a binding with no x-match defaults to all, and the
// routing key is ignored.
func TestHeadersExchangeDefaultsToAllAndIgnoresRoutingKey(t *testing.T) {
	_, ch := connChannel(t)
	ex := declareExchange(t, ch, "headers.default", "headers", nil)
	q := declareQueue(t, ch, "headers.default")
	if err := ch.QueueBind(q.Name, "some-key", ex, false, amqp.Table{"a": int32(1), "b": "x"}); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	publish(t, ch, ex, "other-key", amqp.Publishing{Headers: amqp.Table{"a": int32(1), "b": "x"}, Body: []byte("match")})
	publish(t, ch, ex, "some-key", amqp.Publishing{Headers: amqp.Table{"a": int32(1)}, Body: []byte("partial")})
	msgs := consume(t, ch, q.Name, true)
	if got := bodies(receiveN(t, msgs, 1)); got[0] != "match" {
		t.Fatalf("got %v", got)
	}
	expectNoDelivery(t, msgs)
}

// alternate-exchange argument: messages the exchange cannot route go to the
// alternate exchange; routable ones do not.
func TestAlternateExchange(t *testing.T) {
	_, ch := confirmChannel(t)
	ae := declareExchange(t, ch, "ae", "fanout", nil)
	main := declareExchange(t, ch, "ae.main", "direct", amqp.Table{"alternate-exchange": ae})
	unrouted := declareQueue(t, ch, "ae.unrouted")
	routed := declareQueue(t, ch, "ae.routed")
	if err := ch.QueueBind(unrouted.Name, "", ae, false, nil); err != nil {
		t.Fatalf("bind to ae: %v", err)
	}
	if err := ch.QueueBind(routed.Name, "known", main, false, nil); err != nil {
		t.Fatalf("bind to main: %v", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	publishText(t, ch, main, "known", "routed")
	publish(t, ch, main, "unknown", amqp.Publishing{Body: []byte("to ae"), MessageId: "m-ae"})
	// mandatory is satisfied by the alternate exchange: no basic.return.
	publishMandatory(t, ch, main, "also-unknown", "mandatory to ae")

	assertMessageCount(t, ch, routed.Name, 1)
	assertMessageCount(t, ch, unrouted.Name, 2)
	d := getOne(t, ch, unrouted.Name, true)
	if string(d.Body) != "to ae" || d.Exchange != main || d.RoutingKey != "unknown" || d.MessageId != "m-ae" {
		t.Fatalf("alternate exchange delivery: body %q exchange %q key %q id %q", d.Body, d.Exchange, d.RoutingKey, d.MessageId)
	}
	select {
	case r := <-returns:
		t.Fatalf("unexpected basic.return %d %s", r.ReplyCode, r.ReplyText)
	case <-time.After(quietPeriod):
	}
}

// The default exchange routes by queue name and every queue is bound to it.
func TestDefaultExchangeRoutesByQueueName(t *testing.T) {
	_, ch := confirmChannel(t)
	q1 := declareQueue(t, ch, "default.1")
	q2 := declareQueue(t, ch, "default.2")
	publishText(t, ch, "", q1.Name, "for q1")
	publishText(t, ch, "", q2.Name, "for q2")
	publishText(t, ch, "", "no-such-queue-"+q1.Name, "dropped")
	if d := getOne(t, ch, q1.Name, true); string(d.Body) != "for q1" {
		t.Fatalf("q1 got %q", d.Body)
	}
	if d := getOne(t, ch, q2.Name, true); string(d.Body) != "for q2" {
		t.Fatalf("q2 got %q", d.Body)
	}
	assertMessageCount(t, ch, q1.Name, 0)
}

// The amq.* exchanges exist with their types and route as such.
func TestAmqExchangesPredeclared(t *testing.T) {
	_, ch := connChannel(t)
	for _, name := range []string{"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} {
		if err := ch.ExchangeDeclarePassive(name, "", false, false, false, false, nil); err != nil {
			t.Fatalf("%s does not exist: %v", name, err)
		}
	}
	q := declareQueue(t, ch, "amq")
	if err := ch.QueueBind(q.Name, q.Name+".#", "amq.topic", false, nil); err != nil {
		t.Fatalf("bind to amq.topic: %v", err)
	}
	if err := ch.QueueBind(q.Name, q.Name, "amq.direct", false, nil); err != nil {
		t.Fatalf("bind to amq.direct: %v", err)
	}
	publishText(t, ch, "amq.topic", q.Name+".a.b", "topic")
	publishText(t, ch, "amq.direct", q.Name, "direct")
	msgs := consume(t, ch, q.Name, true)
	if got := bodies(receiveN(t, msgs, 2)); strings.Join(got, "|") != "topic|direct" {
		t.Fatalf("got %v", got)
	}
}
