package interop

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// basic.publish mandatory=true with no matching binding: basic.return with
// 312 NO_ROUTE, carrying the message back (NotifyReturn).
func TestMandatoryUnroutableIsReturned312(t *testing.T) {
	_, ch := connChannel(t)
	ex := declareExchange(t, ch, "mandatory", "direct", nil)
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	publishFlags(t, ch, ex, "nowhere", true, amqp.Publishing{
		ContentType:   "text/plain",
		CorrelationId: "corr-1",
		Headers:       amqp.Table{"h": "v"},
		Body:          []byte("bounce"),
	})
	select {
	case r := <-returns:
		if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" {
			t.Fatalf("basic.return: want 312 NO_ROUTE, got %d %q", r.ReplyCode, r.ReplyText)
		}
		if r.Exchange != ex || r.RoutingKey != "nowhere" {
			t.Fatalf("basic.return: exchange %q key %q", r.Exchange, r.RoutingKey)
		}
		if string(r.Body) != "bounce" || r.ContentType != "text/plain" || r.CorrelationId != "corr-1" || r.Headers["h"] != "v" {
			t.Fatalf("returned message mangled: %+v", r)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no basic.return within %s", waitTimeout)
	}
}

// A mandatory message that is routed is not returned; a non-mandatory
// unroutable one is silently dropped.
func TestMandatoryRoutedIsNotReturned(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "mandatory.ok")
	returns := ch.NotifyReturn(make(chan amqp.Return, 2))
	publishMandatory(t, ch, "", q.Name, "routed")
	publishText(t, ch, "", q.Name+".nope", "dropped without mandatory")
	// Both publishes are confirmed (confirmChannel), and a basic.return precedes its publish's
	// basic.ack, so any return is already queued on the channel: no quiet period is needed.
	select {
	case r := <-returns:
		t.Fatalf("unexpected basic.return %d %q for %q", r.ReplyCode, r.ReplyText, r.Body)
	default:
	}
	assertMessageCount(t, ch, q.Name, 1)
}

// In confirm mode an unroutable mandatory message is returned before it is
// acked.
func TestMandatoryReturnPrecedesConfirm(t *testing.T) {
	_, ch := confirmChannel(t)
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	if err := ch.Publish("", uniqueName(t, "noqueue"), true, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case r := <-returns:
		if r.ReplyCode != amqp.NoRoute {
			t.Fatalf("return code %d", r.ReplyCode)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no basic.return")
	}
	select {
	case c := <-confirms:
		if !c.Ack || c.DeliveryTag != 1 {
			t.Fatalf("confirm: %+v", c)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no confirm")
	}
}

// basic.get on an empty queue: get-empty (ok=false); on a non-empty queue
// the message with the remaining message count.
func TestGetAndGetEmpty(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "get")
	if _, ok, err := ch.Get(q.Name, true); err != nil || ok {
		t.Fatalf("get on empty queue: ok=%v err=%v, want get-empty", ok, err)
	}
	publishText(t, ch, "", q.Name, "first")
	publishText(t, ch, "", q.Name, "second")
	d := getOne(t, ch, q.Name, false)
	if string(d.Body) != "first" || d.MessageCount != 1 || d.Redelivered || d.DeliveryTag != 1 {
		t.Fatalf("get-ok: body %q message-count %d redelivered %v tag %d", d.Body, d.MessageCount, d.Redelivered, d.DeliveryTag)
	}
	if d.Exchange != "" || d.RoutingKey != q.Name {
		t.Fatalf("get-ok: exchange %q key %q", d.Exchange, d.RoutingKey)
	}
	if err := d.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	d = getOne(t, ch, q.Name, true)
	if string(d.Body) != "second" || d.MessageCount != 0 || d.DeliveryTag != 2 {
		t.Fatalf("get-ok: body %q message-count %d tag %d", d.Body, d.MessageCount, d.DeliveryTag)
	}
	if _, ok, err := ch.Get(q.Name, true); err != nil || ok {
		t.Fatalf("get after draining: ok=%v err=%v, want get-empty", ok, err)
	}
}

// basic.get on a missing queue: 404.
func TestGetMissingQueueIs404(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, _, err := ch.Get(uniqueName(t, "none"), true)
	expectChannelError(t, conn, ch, closed, err, amqp.NotFound, "NOT_FOUND")
}

// basic.ack multiple=true acknowledges every message up to the tag; the
// rest are requeued with redelivered=true when the channel closes.
func TestAckMultiple(t *testing.T) {
	conn, ch := confirmChannel(t)
	q := declareQueue(t, ch, "ackmulti")
	for i := 1; i <= 5; i++ {
		publishText(t, ch, "", q.Name, fmt.Sprintf("m%d", i))
	}
	c2 := openChannel(t, conn)
	msgs := consume(t, c2, q.Name, false)
	ds := receiveN(t, msgs, 5)
	if strings.Join(bodies(ds), ",") != "m1,m2,m3,m4,m5" {
		t.Fatalf("got %v", bodies(ds))
	}
	if err := c2.Ack(ds[2].DeliveryTag, true); err != nil { // m1..m3
		t.Fatalf("ack multiple: %v", err)
	}
	if err := c2.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	waitMessageCount(t, ch, q.Name, 2)
	for _, want := range []string{"m4", "m5"} {
		d := getOne(t, ch, q.Name, true)
		if string(d.Body) != want || !d.Redelivered {
			t.Fatalf("want %s redelivered, got %q redelivered=%v", want, d.Body, d.Redelivered)
		}
	}
}

// basic.ack with delivery tag 0 and multiple=true acknowledges everything.
func TestAckMultipleZeroAcksAll(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "ackall")
	for i := 0; i < 3; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	for i := 0; i < 3; i++ {
		getOne(t, ch, q.Name, false)
	}
	if err := ch.Ack(0, true); err != nil {
		t.Fatalf("ack(0, multiple): %v", err)
	}
	if err := ch.Recover(true); err != nil { // would requeue anything unacked
		t.Fatalf("recover: %v", err)
	}
	expectQueueStaysEmpty(t, ch, q.Name)
}

// basic.nack multiple=true requeue=true: the messages come back, in order,
// with redelivered=true.
func TestNackMultipleRequeueRedelivers(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "nack")
	for i := 1; i <= 4; i++ {
		publishText(t, ch, "", q.Name, fmt.Sprintf("m%d", i))
	}
	var last amqp.Delivery
	for i := 1; i <= 3; i++ {
		last = getOne(t, ch, q.Name, false)
	}
	if err := ch.Nack(last.DeliveryTag, true, true); err != nil { // m1..m3
		t.Fatalf("nack: %v", err)
	}
	waitMessageCount(t, ch, q.Name, 4)
	msgs := consume(t, ch, q.Name, true)
	ds := receiveN(t, msgs, 4)
	if strings.Join(bodies(ds), ",") != "m1,m2,m3,m4" {
		t.Fatalf("after nack got %v, want m1,m2,m3,m4", bodies(ds))
	}
	for i, d := range ds {
		if want := i < 3; d.Redelivered != want {
			t.Fatalf("%s: redelivered=%v, want %v", d.Body, d.Redelivered, want)
		}
	}
}

// basic.nack requeue=false drops the message.
func TestNackWithoutRequeueDiscards(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "nack.drop")
	publishText(t, ch, "", q.Name, "drop me")
	publishText(t, ch, "", q.Name, "keep me")
	d := getOne(t, ch, q.Name, false)
	if err := d.Nack(false, false); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if err := ch.Recover(true); err != nil { // would requeue it were it still unacked
		t.Fatalf("recover: %v", err)
	}
	if d := getOne(t, ch, q.Name, true); string(d.Body) != "keep me" || d.Redelivered {
		t.Fatalf("got %q redelivered=%v", d.Body, d.Redelivered)
	}
	expectQueueStaysEmpty(t, ch, q.Name)
}

// basic.reject requeue=true redelivers (redelivered=true); requeue=false
// discards.
func TestRejectRequeueAndDiscard(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "reject")
	publishText(t, ch, "", q.Name, "only")
	d := getOne(t, ch, q.Name, false)
	if d.Redelivered {
		t.Fatalf("first delivery marked redelivered")
	}
	if err := d.Reject(true); err != nil {
		t.Fatalf("reject requeue: %v", err)
	}
	d = getOne(t, ch, q.Name, false)
	if string(d.Body) != "only" || !d.Redelivered {
		t.Fatalf("after reject(requeue) got %q redelivered=%v", d.Body, d.Redelivered)
	}
	if err := d.Reject(false); err != nil {
		t.Fatalf("reject discard: %v", err)
	}
	if err := ch.Recover(true); err != nil { // would requeue it were it still unacked
		t.Fatalf("recover: %v", err)
	}
	expectQueueStaysEmpty(t, ch, q.Name)
}

// basic.ack of an unknown delivery tag: channel error 406.
func TestAckUnknownDeliveryTagIs406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Ack(42, false); err != nil {
		t.Fatalf("ack is asynchronous, the send itself should succeed: %v", err)
	}
	e := waitChannelClosed(t, closed)
	if e.Code != amqp.PreconditionFailed || !strings.HasPrefix(e.Reason, "PRECONDITION_FAILED") || !strings.Contains(e.Reason, "42") {
		t.Fatalf("want 406 PRECONDITION_FAILED about tag 42, got %d %q", e.Code, e.Reason)
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed by a channel error")
	}
}

// basic.recover requeue=true: unacked messages are redelivered to the
// consumer with redelivered=true.
func TestRecoverRequeueRedelivers(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "recover")
	publishText(t, ch, "", q.Name, "a")
	publishText(t, ch, "", q.Name, "b")
	msgs := consume(t, ch, q.Name, false)
	first := receiveN(t, msgs, 2)
	if first[0].Redelivered || first[1].Redelivered {
		t.Fatalf("first deliveries marked redelivered")
	}
	if err := ch.Recover(true); err != nil {
		t.Fatalf("basic.recover: %v", err)
	}
	again := receiveN(t, msgs, 2)
	if strings.Join(bodies(again), ",") != "a,b" {
		t.Fatalf("redelivered %v", bodies(again))
	}
	for _, d := range again {
		if !d.Redelivered {
			t.Fatalf("%s not marked redelivered", d.Body)
		}
		if d.DeliveryTag <= first[1].DeliveryTag {
			t.Fatalf("redelivery reused delivery tag %d", d.DeliveryTag)
		}
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	expectNoDelivery(t, msgs)
	assertMessageCount(t, ch, q.Name, 0)
}

// basic.recover requeue=false is not implemented by RabbitMQ: connection
// error 540 NOT_IMPLEMENTED.
func TestRecoverWithoutRequeueIs540(t *testing.T) {
	conn, ch := connChannel(t)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.Recover(false)
	expectConnectionError(t, conn, closed, err, amqp.NotImplemented, "NOT_IMPLEMENTED")
}

// basic.qos per consumer (global=false): each consumer gets at most
// prefetch unacked messages; acking releases the next.
func TestQosPerConsumerPrefetchLimitsDeliveries(t *testing.T) {
	_, ch := confirmChannel(t)
	q1 := declareQueue(t, ch, "qos.1")
	q2 := declareQueue(t, ch, "qos.2")
	for i := 0; i < 10; i++ {
		publishText(t, ch, "", q1.Name, fmt.Sprintf("a%d", i))
		publishText(t, ch, "", q2.Name, fmt.Sprintf("b%d", i))
	}
	if err := ch.Qos(3, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	m1 := consume(t, ch, q1.Name, false)
	m2 := consume(t, ch, q2.Name, false)
	d1 := receiveN(t, m1, 3)
	receiveN(t, m2, 3) // each consumer has its own limit of 3
	fenceGet(t, ch, q1.Name, "a3", 6)
	fenceGet(t, ch, q2.Name, "b3", 6)

	if err := d1[1].Ack(true); err != nil { // acks a0, a1
		t.Fatalf("ack: %v", err)
	}
	more := receiveN(t, m1, 2)
	if strings.Join(bodies(more), ",") != "a4,a5" {
		t.Fatalf("after acking 2 got %v, want a4,a5", bodies(more))
	}
	fenceGet(t, ch, q1.Name, "a6", 3)
	fenceGet(t, ch, q2.Name, "b4", 5)
}

// basic.qos global=true: the limit is shared by all consumers of the
// channel (RabbitMQ semantics).
func TestQosGlobalPrefetchSharedAcrossConsumers(t *testing.T) {
	_, ch := confirmChannel(t)
	q1 := declareQueue(t, ch, "qosg.1")
	q2 := declareQueue(t, ch, "qosg.2")
	for i := 0; i < 10; i++ {
		publishText(t, ch, "", q1.Name, fmt.Sprintf("a%d", i))
		publishText(t, ch, "", q2.Name, fmt.Sprintf("b%d", i))
	}
	if err := ch.Qos(4, 0, true); err != nil {
		t.Fatalf("qos global: %v", err)
	}
	m1 := consume(t, ch, q1.Name, false)
	m2 := consume(t, ch, q2.Name, false)

	delivered := map[string]int{}
	deadline := time.After(waitTimeout)
	for n := 0; n < 4; n++ {
		select {
		case <-m1:
			delivered[q1.Name]++
		case <-m2:
			delivered[q2.Name]++
		case <-deadline:
			t.Fatalf("got %d of 4 deliveries under a global prefetch of 4", n)
		}
	}
	// The fences name the next message of each queue: a fifth delivery would have taken one.
	fenceGet(t, ch, q1.Name, fmt.Sprintf("a%d", delivered[q1.Name]), 10-delivered[q1.Name]-1)
	fenceGet(t, ch, q2.Name, fmt.Sprintf("b%d", delivered[q2.Name]), 10-delivered[q2.Name]-1)
	if err := ch.Ack(0, true); err != nil {
		t.Fatalf("ack all: %v", err)
	}
	n := 0
	deadline = time.After(waitTimeout)
	for n < 4 {
		select {
		case <-m1:
			n++
		case <-m2:
			n++
		case <-deadline:
			t.Fatalf("after ack got %d of 4 further deliveries", n)
		}
	}
}

// basic.qos prefetch does not limit no-ack consumers.
func TestQosDoesNotLimitNoAckConsumer(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "qos.noack")
	for i := 0; i < 10; i++ {
		publishText(t, ch, "", q.Name, "m")
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	receiveN(t, consume(t, ch, q.Name, true), 10)
}

// basic.consume exclusive on a queue that already has a consumer (or a
// second exclusive consumer): 403 ACCESS_REFUSED, channel closed.
func TestConsumeExclusiveTwiceIs403(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "exclusive.consumer")
	if _, err := ch.Consume(q.Name, "first", false, true, false, false, nil); err != nil {
		t.Fatalf("first exclusive consume: %v", err)
	}
	c2 := openChannel(t, conn)
	closed := c2.NotifyClose(make(chan *amqp.Error, 1))
	_, err := c2.Consume(q.Name, "second", false, true, false, false, nil)
	e := expectChannelError(t, conn, c2, closed, err, amqp.AccessRefused, "ACCESS_REFUSED")
	if !strings.Contains(e.Reason, q.Name) {
		t.Fatalf("reply text should name the queue: %q", e.Reason)
	}
	// A non-exclusive consumer is refused too.
	c3 := openChannel(t, conn)
	closed3 := c3.NotifyClose(make(chan *amqp.Error, 1))
	_, err = c3.Consume(q.Name, "third", false, false, false, false, nil)
	expectChannelError(t, conn, c3, closed3, err, amqp.AccessRefused, "ACCESS_REFUSED")
	// The original consumer still works.
	if ch.IsClosed() {
		t.Fatalf("first channel closed")
	}
}

// basic.consume exclusive when another consumer exists: 403.
func TestConsumeExclusiveWithExistingConsumerIs403(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "exclusive.late")
	if _, err := ch.Consume(q.Name, "shared", false, false, false, false, nil); err != nil {
		t.Fatalf("consume: %v", err)
	}
	c2 := openChannel(t, conn)
	closed := c2.NotifyClose(make(chan *amqp.Error, 1))
	_, err := c2.Consume(q.Name, "exclusive", false, true, false, false, nil)
	expectChannelError(t, conn, c2, closed, err, amqp.AccessRefused, "ACCESS_REFUSED")
}

// basic.consume with a consumer tag already used on the channel: 530
// NOT_ALLOWED, a connection error.
func TestConsumeDuplicateTagIs530(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "duptag")
	if _, err := ch.Consume(q.Name, "same-tag", true, false, false, false, nil); err != nil {
		t.Fatalf("consume: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.Consume(q.Name, "same-tag", true, false, false, false, nil)
	expectConnectionError(t, conn, closed, err, amqp.NotAllowed, "NOT_ALLOWED")
}

// basic.consume on a missing queue: 404.
func TestConsumeMissingQueueIs404(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.Consume(uniqueName(t, "none"), "", true, false, false, false, nil)
	expectChannelError(t, conn, ch, closed, err, amqp.NotFound, "NOT_FOUND")
}

// basic.cancel from the client: the delivery channel closes and later
// messages stay in the queue.
func TestConsumerCancelByClient(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "cancel")
	msgs, err := ch.Consume(q.Name, "my-consumer", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	publishText(t, ch, "", q.Name, "before")
	d := receive(t, msgs)
	if string(d.Body) != "before" || d.ConsumerTag != "my-consumer" {
		t.Fatalf("got %q for consumer %q", d.Body, d.ConsumerTag)
	}
	if err := ch.Cancel("my-consumer", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	select {
	case _, ok := <-msgs:
		if ok {
			t.Fatalf("delivery after cancel")
		}
	case <-time.After(waitTimeout):
		t.Fatalf("delivery channel not closed after cancel")
	}
	publishText(t, ch, "", q.Name, "after")
	q2, err := ch.QueueInspect(q.Name)
	if err != nil || q2.Messages != 1 || q2.Consumers != 0 {
		t.Fatalf("after cancel: %+v %v", q2, err)
	}
}

// Broker-initiated basic.cancel when the queue is deleted
// (consumer_cancel_notify): NotifyCancel receives the consumer tag.
func TestConsumerCancelledByBrokerWhenQueueDeleted(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "cancelnotify")
	cancels := ch.NotifyCancel(make(chan string, 1))
	msgs, err := ch.Consume(q.Name, "doomed-consumer", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	other := openChannel(t, conn)
	if _, err := other.QueueDelete(q.Name, false, false, false); err != nil {
		t.Fatalf("queue.delete: %v", err)
	}
	select {
	case tag := <-cancels:
		if tag != "doomed-consumer" {
			t.Fatalf("NotifyCancel: want doomed-consumer, got %q", tag)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no broker basic.cancel within %s", waitTimeout)
	}
	select {
	case _, ok := <-msgs:
		if ok {
			t.Fatalf("delivery after broker cancel")
		}
	case <-time.After(waitTimeout):
		t.Fatalf("delivery channel not closed after broker cancel")
	}
	if ch.IsClosed() {
		t.Fatalf("channel closed by a broker cancel")
	}
}

// Publishing properties round-trip unchanged.
func TestBasicPropertiesRoundTrip(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "props")
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	user := parsedURI(t).Username
	sent := amqp.Publishing{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-42",
		ReplyTo:         "reply-here",
		MessageId:       "msg-42",
		Timestamp:       ts,
		Type:            "order.created",
		UserId:          user,
		AppId:           "lepus-interop-go",
		Body:            []byte(`{"a":1}`),
	}
	publish(t, ch, "", q.Name, sent)
	d := getOne(t, ch, q.Name, true)
	if d.ContentType != sent.ContentType || d.ContentEncoding != sent.ContentEncoding ||
		d.DeliveryMode != sent.DeliveryMode || d.Priority != sent.Priority ||
		d.CorrelationId != sent.CorrelationId || d.ReplyTo != sent.ReplyTo ||
		d.MessageId != sent.MessageId || !d.Timestamp.Equal(ts) || d.Type != sent.Type ||
		d.UserId != sent.UserId || d.AppId != sent.AppId || string(d.Body) != string(sent.Body) {
		t.Fatalf("properties changed:\nsent %+v\ngot  %+v", sent, d)
	}
}

// A user-id property that is not the connection's user: 406.
func TestPublishWithForeignUserIdIs406(t *testing.T) {
	conn, ch := connChannel(t)
	q := declareQueue(t, ch, "userid")
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_ = ch.Publish("", q.Name, false, false, amqp.Publishing{UserId: "not-" + parsedURI(t).Username, Body: []byte("x")})
	e := waitChannelClosed(t, closed)
	if e.Code != amqp.PreconditionFailed || !strings.HasPrefix(e.Reason, "PRECONDITION_FAILED") {
		t.Fatalf("want 406 PRECONDITION_FAILED, got %d %q", e.Code, e.Reason)
	}
	if conn.IsClosed() {
		t.Fatalf("connection closed by a channel error")
	}
}

// A 2 MiB body spans many frames (frame_max 131072) and arrives intact.
func TestLargeBodyAcrossFrames(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "large")
	body := make([]byte, 2<<20)
	for i := range body {
		body[i] = byte(i*7 + i/251)
	}
	publish(t, ch, "", q.Name, amqp.Publishing{ContentType: "application/octet-stream", Body: body})
	publish(t, ch, "", q.Name, amqp.Publishing{Body: []byte{}}) // and an empty one
	msgs := consume(t, ch, q.Name, true)
	d := receive(t, msgs)
	if len(d.Body) != len(body) || !bytes.Equal(d.Body, body) {
		t.Fatalf("2 MiB body came back as %d bytes (equal=%v)", len(d.Body), bytes.Equal(d.Body, body))
	}
	if d.ContentType != "application/octet-stream" {
		t.Fatalf("content type %q", d.ContentType)
	}
	if d := receive(t, msgs); len(d.Body) != 0 {
		t.Fatalf("empty body came back as %d bytes", len(d.Body))
	}
}

// Every field-table value type amqp091-go can send round-trips through the
// broker unchanged in the message headers.
func TestHeadersTableValueTypesRoundTrip(t *testing.T) {
	_, ch := confirmChannel(t)
	q := declareQueue(t, ch, "table")
	ts := time.Unix(1700000000, 0)
	headers := amqp.Table{
		"string":  "héllo wörld",
		"empty":   "",
		"bool-t":  true,
		"bool-f":  false,
		"int8":    int8(-8),
		"int16":   int16(-1600),
		"int32":   int32(-320000),
		"int64":   int64(-6400000000),
		"uint8":   byte(200),
		"uint16":  uint16(60000),
		"uint32":  uint32(4000000000),
		"float32": float32(3.5),
		"float64": float64(-2.25e100),
		"decimal": amqp.Decimal{Scale: 2, Value: 12345},
		"time":    ts,
		"bytes":   []byte{0, 1, 2, 255},
		"array":   []interface{}{"a", int32(1), true, []interface{}{int64(2)}, amqp.Table{"k": "v"}, nil},
		"table":   amqp.Table{"nested": amqp.Table{"deep": int32(7)}, "s": "x"},
		"void":    nil,
	}
	if err := headers.Validate(); err != nil {
		t.Fatalf("test table invalid: %v", err)
	}
	publish(t, ch, "", q.Name, amqp.Publishing{Headers: headers, Body: []byte("table")})
	d := getOne(t, ch, q.Name, true)
	for k, want := range headers {
		got, ok := d.Headers[k]
		if !ok {
			t.Errorf("header %q missing", k)
			continue
		}
		if wt, isTime := want.(time.Time); isTime {
			gt, ok := got.(time.Time)
			if !ok || !gt.Equal(wt) {
				t.Errorf("header %q: want %v, got %#v", k, wt, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("header %q: want %#v (%T), got %#v (%T)", k, want, want, got, got)
		}
	}
	if len(d.Headers) != len(headers) {
		t.Errorf("want %d headers, got %d: %#v", len(headers), len(d.Headers), d.Headers)
	}
}
