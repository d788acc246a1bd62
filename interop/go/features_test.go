package interop

// Queue and exchange features through amqp091-go (issue 12): message TTL with dead-lettering,
// queue expiry, length limits and their overflow modes, direct reply-to and the consistent-hash
// exchange, each checked against RabbitMQ 3.10.8's answers (reply codes, texts, header types);
// then Lepus's extensions (delayed exchange, deduplication, a delivery limit on classic queues),
// skipped on RabbitMQ with the reason. Priorities, single active consumer and the x-death merge
// of a rejected message are in consumers_test.go and dead_letter_test.go.

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lepusOnly skips a test of a feature RabbitMQ 3.10.8 (Debian's package) does not have.
func lepusOnly(t *testing.T, reason string) {
	t.Helper()
	if product := brokerProduct(t); product != "Lepus" {
		t.Skipf("Lepus only (the broker is %q): %s", product, reason)
	}
}

// declareWithArgs declares a non-durable queue with arguments, deleted when the test ends.
func declareWithArgs(t *testing.T, ch *amqp.Channel, prefix string, args amqp.Table) string {
	t.Helper()
	name := uniqueName(t, prefix)
	if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		t.Fatalf("queue.declare %s %v: %v", name, args, err)
	}
	cleanupQueue(t, name)
	return name
}

// expectDeclareRefused declares a queue with args on a fresh channel of conn and checks the
// channel is closed with 406 and exactly RabbitMQ's text (%s in want is the queue's name), and
// that nothing was half-made. A wrong answer is reported and the test goes on to the next case.
func expectDeclareRefused(t *testing.T, conn *amqp.Connection, args amqp.Table, want string) {
	t.Helper()
	ch := openChannel(t, conn)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t, "refused")
	_, err := ch.QueueDeclare(name, false, false, false, false, args)
	if err == nil {
		cleanupQueue(t, name)
		t.Errorf("queue.declare %v succeeded, want 406 %q", args, strings.ReplaceAll(want, "%s", name))
		return
	}
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if text := strings.ReplaceAll(want, "%s", name); e.Reason != text {
		t.Errorf("queue.declare %v: reply text\n got %q\nwant %q", args, e.Reason, text)
	}
	if queueExists(name) {
		cleanupQueue(t, name)
		t.Errorf("queue %s exists after its declaration was refused", name)
	}
}

// drainBodies takes every ready message of queue with basic.get (auto-ack), in order.
func drainBodies(t *testing.T, ch *amqp.Channel, queue string) []string {
	t.Helper()
	var got []string
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			return got
		}
		got = append(got, string(d.Body))
	}
}

// xDeath checks a dead letter's single x-death entry with the field types RabbitMQ writes and
// returns it.
func xDeath(t *testing.T, d amqp.Delivery, queue, reason string) amqp.Table {
	t.Helper()
	deaths, ok := d.Headers["x-death"].([]interface{})
	if !ok || len(deaths) != 1 {
		t.Fatalf("%q: x-death = %#v (%T), want an array of 1 table", d.Body, d.Headers["x-death"], d.Headers["x-death"])
	}
	entry, ok := deaths[0].(amqp.Table)
	if !ok {
		t.Fatalf("x-death[0] is %T, want a table", deaths[0])
	}
	if count, ok := entry["count"].(int64); !ok || count != 1 {
		t.Errorf("x-death[0].count = %#v (%T), want int64 1", entry["count"], entry["count"])
	}
	for key, value := range map[string]string{"queue": queue, "reason": reason, "exchange": ""} {
		if text, ok := entry[key].(string); !ok || text != value {
			t.Errorf("x-death[0].%s = %#v (%T), want string %q", key, entry[key], entry[key], value)
		}
	}
	if keys, ok := entry["routing-keys"].([]interface{}); !ok || !reflect.DeepEqual(keys, []interface{}{queue}) {
		t.Errorf("x-death[0].routing-keys = %#v (%T), want [%q]", entry["routing-keys"], entry["routing-keys"], queue)
	}
	if when, ok := entry["time"].(time.Time); !ok || time.Since(when) > time.Minute || time.Until(when) > time.Minute {
		t.Errorf("x-death[0].time = %#v (%T), want a recent timestamp", entry["time"], entry["time"])
	}
	for key, value := range map[string]string{"x-first-death-queue": queue, "x-first-death-reason": reason, "x-first-death-exchange": ""} {
		if text, ok := d.Headers[key].(string); !ok || text != value {
			t.Errorf("%s = %#v (%T), want string %q", key, d.Headers[key], d.Headers[key], value)
		}
	}
	return entry
}

// x-message-ttl and a message's expiration dead-letter with reason expired; the per-message
// expiration is removed from the dead letter and kept as x-death's original-expiration.
func TestMessageTTLDeadLettersExpiredWithOriginalExpiration(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "ttl-dead").Name
	source := declareWithArgs(t, ch, "ttl", amqp.Table{"x-message-ttl": int32(150),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
	published := time.Now()
	publish(t, ch, "", source, amqp.Publishing{Body: []byte("queue-ttl"), Headers: amqp.Table{"keep": "me"}})
	publish(t, ch, "", source, amqp.Publishing{Body: []byte("own-ttl"), Expiration: "50"})
	first := getEventually(t, ch, dead)
	second := getEventually(t, ch, dead)
	if elapsed := time.Since(published); elapsed < 150*time.Millisecond {
		t.Fatalf("both dead-lettered after %s, before the queue's TTL of 150 ms", elapsed)
	}
	byBody := map[string]amqp.Delivery{string(first.Body): first, string(second.Body): second}
	queueTTL, ok := byBody["queue-ttl"]
	if !ok {
		t.Fatalf("dead letters %q and %q, want queue-ttl and own-ttl", first.Body, second.Body)
	}
	entry := xDeath(t, queueTTL, source, "expired")
	if _, ok := entry["original-expiration"]; ok {
		t.Errorf("x-death has original-expiration %#v for a message published without one", entry["original-expiration"])
	}
	if keep, ok := queueTTL.Headers["keep"].(string); !ok || keep != "me" {
		t.Errorf("the publisher's header keep = %#v, want \"me\"", queueTTL.Headers["keep"])
	}
	ownTTL := byBody["own-ttl"]
	entry = xDeath(t, ownTTL, source, "expired")
	if expiration, ok := entry["original-expiration"].(string); !ok || expiration != "50" {
		t.Errorf("x-death[0].original-expiration = %#v (%T), want string \"50\"", entry["original-expiration"], entry["original-expiration"])
	}
	if ownTTL.Expiration != "" {
		t.Errorf("the dead letter kept expiration %q, want it removed", ownTTL.Expiration)
	}
	assertMessageCount(t, ch, source, 0)
}

// A message whose TTL passed is never delivered, and without a dead-letter exchange it is gone;
// an expiration of "0" is delivered only to a consumer waiting at the time.
func TestMessageTTLExpiredMessagesAreNotDelivered(t *testing.T) {
	_, ch := confirmChannel(t)
	queue := declareWithArgs(t, ch, "ttl-drop", amqp.Table{"x-message-ttl": int32(100)})
	publishText(t, ch, "", queue, "stale")
	publish(t, ch, "", queue, amqp.Publishing{Body: []byte("now-or-never"), Expiration: "0"})
	time.Sleep(250 * time.Millisecond)
	expectQueueStaysEmpty(t, ch, queue)
	msgs := consume(t, ch, queue, true)
	publish(t, ch, "", queue, amqp.Publishing{Body: []byte("to-a-waiting-consumer"), Expiration: "0"})
	if d := receive(t, msgs); string(d.Body) != "to-a-waiting-consumer" {
		t.Fatalf("got %q, want to-a-waiting-consumer", d.Body)
	}
}

// Bad x-message-ttl values: RabbitMQ's 406 texts (Lepus took 315360000001 and worded a string
// {unacceptable_type,longstr} until this test found it).
func TestMessageTTLBadValuesAre406(t *testing.T) {
	conn := dial(t)
	expectDeclareRefused(t, conn, amqp.Table{"x-message-ttl": int32(-1)},
		"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' in vhost '/': {value_negative,-1}")
	// The longest TTL RabbitMQ 3.10.8 takes is ten years in milliseconds, as for x-expires.
	declareWithArgs(t, openChannel(t, conn), "ttl-longest", amqp.Table{"x-message-ttl": int64(315360000000)})
	expectDeclareRefused(t, conn, amqp.Table{"x-message-ttl": int64(315360000001)},
		"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' in vhost '/': {value_too_large,315360000001}")
	expectDeclareRefused(t, conn, amqp.Table{"x-message-ttl": "soon"},
		"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '%s' in vhost '/': \"expected integer, got longstr\"")
}

// A message whose expiration is not a non-negative integer closes the channel with RabbitMQ's 406
// (Lepus enqueued it and kept the channel open until this test found it).
func TestMessageExpirationInvalidIs406(t *testing.T) {
	conn := dial(t)
	for expiration, want := range map[string]string{
		"soon": "PRECONDITION_FAILED - invalid expiration 'soon': no_integer",
		"-1":   "PRECONDITION_FAILED - invalid expiration '-1': {value_negative,-1}",
	} {
		ch := openChannel(t, conn)
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		queue := declareQueue(t, ch, "ttl-bad").Name
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{Body: []byte("x"), Expiration: expiration}); err != nil {
			t.Fatalf("publish: %v", err)
		}
		// A synchronous method behind the publish: the broker answers it only after the publish.
		if q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err == nil {
			t.Errorf("expiration %q: the channel is still open (the queue holds %d), want 406 %q", expiration, q.Messages, want)
			continue
		}
		e := waitChannelClosed(t, closed)
		if e.Code != amqp.PreconditionFailed || e.Reason != want {
			t.Errorf("expiration %q: channel closed with %d %q, want 406 %q", expiration, e.Code, e.Reason, want)
		}
	}
}

// messageCount is the ready-message count of queue, from a passive declare on a new channel.
func messageCount(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch := openChannel(t, conn)
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Messages
}

// x-expires deletes a queue unused for that long; a passive queue.declare is a use that renews
// the lease (as RabbitMQ counts it); a consumer keeps the queue alive.
func TestQueueExpiresDeletesAnUnusedQueue(t *testing.T) {
	_, ch := connChannel(t)
	unused := declareWithArgs(t, ch, "expires", amqp.Table{"x-expires": int32(800)})
	used := declareWithArgs(t, ch, "expires-used", amqp.Table{"x-expires": int32(800)})
	consume(t, ch, used, true)
	time.Sleep(400 * time.Millisecond)
	if !queueExists(unused) {
		t.Fatalf("the queue expired after 400 ms, before its x-expires of 800 ms")
	}
	time.Sleep(600 * time.Millisecond)
	if !queueExists(unused) {
		t.Fatalf("the queue expired 1 s after its declaration: the passive declare at 400 ms did not renew its lease")
	}
	time.Sleep(1100 * time.Millisecond)
	if queueExists(unused) {
		t.Fatalf("the unused queue still exists 1.1 s after its last use (x-expires 800 ms)")
	}
	if !queueExists(used) {
		t.Fatalf("the queue with a consumer expired")
	}
	conn := dial(t)
	expectDeclareRefused(t, conn, amqp.Table{"x-expires": int32(0)},
		"PRECONDITION_FAILED - invalid arg 'x-expires' for queue '%s' in vhost '/': {value_zero,0}")
}

// x-max-length with the default overflow (drop-head) drops the oldest messages, dead-lettering
// them with reason maxlen.
func TestMaxLengthDropHeadDeadLettersTheOldest(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "maxlen-dead").Name
	queue := declareWithArgs(t, ch, "maxlen", amqp.Table{"x-max-length": int32(2),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
	for i := 1; i <= 4; i++ {
		publishText(t, ch, "", queue, fmt.Sprint("m", i))
	}
	assertMessageCount(t, ch, queue, 2)
	if got := []string{string(getOne(t, ch, queue, true).Body), string(getOne(t, ch, queue, true).Body)}; !reflect.DeepEqual(got, []string{"m3", "m4"}) {
		t.Fatalf("kept %v, want [m3 m4]", got)
	}
	for _, want := range []string{"m1", "m2"} {
		d := getEventually(t, ch, dead)
		if string(d.Body) != want {
			t.Fatalf("dead letter %q, want %q", d.Body, want)
		}
		xDeath(t, d, queue, "maxlen")
	}
}

// x-overflow reject-publish: a publish past the limit is nacked (basic.nack with confirms) and
// not dead-lettered; reject-publish-dlx dead-letters it with reason maxlen.
func TestMaxLengthRejectPublishNacks(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "reject-dead").Name
	for _, overflow := range []string{"reject-publish", "reject-publish-dlx"} {
		queue := declareWithArgs(t, ch, overflow, amqp.Table{"x-max-length": int32(2), "x-overflow": overflow,
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
		var acks []bool
		for i := 1; i <= 3; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false,
				amqp.Publishing{Body: []byte(fmt.Sprint(overflow, "-", i))})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			acked, err := dc.WaitContext(ctx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for a confirm: %v", err)
			}
			acks = append(acks, acked)
		}
		if want := []bool{true, true, false}; !reflect.DeepEqual(acks, want) {
			t.Fatalf("%s: confirms (ack=true) %v, want %v", overflow, acks, want)
		}
		assertMessageCount(t, ch, queue, 2)
		if d := getOne(t, ch, queue, true); string(d.Body) != overflow+"-1" {
			t.Fatalf("%s: head %q, want the first message kept", overflow, d.Body)
		}
	}
	d := getEventually(t, ch, dead)
	if string(d.Body) != "reject-publish-dlx-3" {
		t.Fatalf("dead letter %q, want reject-publish-dlx-3 (reject-publish dead-letters nothing)", d.Body)
	}
	deaths, _ := d.Headers["x-death"].([]interface{})
	entry, _ := deaths[0].(amqp.Table)
	if reason, _ := entry["reason"].(string); reason != "maxlen" || len(deaths) != 1 {
		t.Fatalf("x-death = %#v, want one entry with reason maxlen", d.Headers["x-death"])
	}
	expectQueueStaysEmpty(t, ch, dead)
}

// x-max-length-bytes counts message bodies: the oldest go until the rest fit.
func TestMaxLengthBytesDropsTheOldest(t *testing.T) {
	_, ch := confirmChannel(t)
	queue := declareWithArgs(t, ch, "maxbytes", amqp.Table{"x-max-length-bytes": int32(10)})
	for _, body := range []string{"aaaa", "bbbb", "cccc", "dd"} {
		publish(t, ch, "", queue, amqp.Publishing{Body: []byte(body), Headers: amqp.Table{"padding": strings.Repeat("h", 100)}})
	}
	got := drainBodies(t, ch, queue)
	if want := []string{"bbbb", "cccc", "dd"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("kept %v, want %v (10 bytes of bodies; headers do not count)", got, want)
	}
}

// Bad length-limit arguments: RabbitMQ's 406 texts (Lepus worded x-max-length "ten" and x-overflow
// "sideways" otherwise until this test found it).
func TestMaxLengthBadValuesAre406(t *testing.T) {
	conn := dial(t)
	expectDeclareRefused(t, conn, amqp.Table{"x-max-length": int32(-1)},
		"PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '%s' in vhost '/': {value_negative,-1}")
	expectDeclareRefused(t, conn, amqp.Table{"x-max-length": "ten"},
		"PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '%s' in vhost '/': \"expected integer, got longstr\"")
	expectDeclareRefused(t, conn, amqp.Table{"x-overflow": int32(5)},
		"PRECONDITION_FAILED - invalid arg 'x-overflow' for queue '%s' in vhost '/': {unacceptable_type,signedint}")
	expectDeclareRefused(t, conn, amqp.Table{"x-max-length-bytes": "big"},
		"PRECONDITION_FAILED - invalid arg 'x-max-length-bytes' for queue '%s' in vhost '/': \"expected integer, got longstr\"")
	expectDeclareRefused(t, conn, amqp.Table{"x-overflow": "sideways"},
		`PRECONDITION_FAILED - invalid arg 'x-overflow' for queue '%s' in vhost '/': invalid_overflow`)
}

const directReplyTo = "amq.rabbitmq.reply-to"

// Direct reply-to: an RPC client consumes amq.rabbitmq.reply-to with no-ack, its request's
// reply_to becomes amq.rabbitmq.reply-to.<token>, and the reply published to that address on the
// default exchange reaches the requesting channel.
func TestDirectReplyToRoundTrip(t *testing.T) {
	clientConn, client := connChannel(t)
	if capabilities, _ := clientConn.Properties["capabilities"].(amqp.Table); capabilities["direct_reply_to"] != true {
		t.Fatalf("capabilities.direct_reply_to = %#v, want true", capabilities["direct_reply_to"])
	}
	_, server := connChannel(t)
	requests := declareQueue(t, server, "rpc").Name
	replies, err := client.Consume(directReplyTo, "rpc-client", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume %s: %v", directReplyTo, err)
	}
	publish(t, client, "", requests, amqp.Publishing{Body: []byte("ping"), ReplyTo: directReplyTo, CorrelationId: "c-1"})
	request := getEventually(t, server, requests)
	_ = request.Ack(false)
	if string(request.Body) != "ping" || request.CorrelationId != "c-1" {
		t.Fatalf("request %q correlation %q", request.Body, request.CorrelationId)
	}
	if !strings.HasPrefix(request.ReplyTo, directReplyTo+".") || len(request.ReplyTo) <= len(directReplyTo)+1 {
		t.Fatalf("reply_to %q, want %s.<token>", request.ReplyTo, directReplyTo)
	}
	publish(t, server, "", request.ReplyTo, amqp.Publishing{Body: []byte("pong"), CorrelationId: "c-1"})
	reply := receive(t, replies)
	if string(reply.Body) != "pong" || reply.CorrelationId != "c-1" || reply.Exchange != "" ||
		reply.RoutingKey != request.ReplyTo || reply.ConsumerTag != "rpc-client" || reply.Redelivered {
		t.Fatalf("reply %q correlation %q exchange %q key %q tag %q redelivered %v",
			reply.Body, reply.CorrelationId, reply.Exchange, reply.RoutingKey, reply.ConsumerTag, reply.Redelivered)
	}
	expectNoDelivery(t, replies)
}

// Direct reply-to refusals, with RabbitMQ's texts: a consumer that would ack, and a request from
// a channel that does not consume replies.
func TestDirectReplyToRefusalsAre406(t *testing.T) {
	conn, ch := connChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, err := ch.Consume(directReplyTo, "", false, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if e.Reason != "PRECONDITION_FAILED - reply consumer cannot acknowledge" {
		t.Fatalf("reply text %q", e.Reason)
	}
	ch = openChannel(t, conn)
	closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	queue := uniqueName(t, "rpc-none")
	if err := ch.PublishWithContext(context.Background(), "", queue, false, false,
		amqp.Publishing{Body: []byte("request"), ReplyTo: directReplyTo}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	e = waitChannelClosed(t, closed)
	if e.Code != amqp.PreconditionFailed || e.Reason != "PRECONDITION_FAILED - fast reply consumer does not exist" {
		t.Fatalf("channel closed with %d %q", e.Code, e.Reason)
	}
}

// declareConsistentHash declares an x-consistent-hash exchange, or skips where the broker has no
// such type (503 closes the connection), as the Python suite does. The reference node enables
// rabbitmq_consistent_hash_exchange (Debian's package ships it), so it runs there too.
func declareConsistentHash(t *testing.T, args amqp.Table) (*amqp.Connection, *amqp.Channel, string) {
	t.Helper()
	conn, ch := connChannel(t)
	name := uniqueName(t, "chx")
	err := ch.ExchangeDeclare(name, "x-consistent-hash", false, false, false, false, args)
	if e, ok := err.(*amqp.Error); ok && e.Code == amqp.CommandInvalid {
		t.Skipf("the broker has no x-consistent-hash exchange type (rabbitmq_consistent_hash_exchange plugin): %v", e)
	}
	if err != nil {
		t.Fatalf("exchange.declare %s x-consistent-hash: %v", name, err)
	}
	cleanupExchange(t, name)
	return conn, ch, name
}

// x-consistent-hash: each routing key reaches one queue, always the same one, and the queues'
// shares follow the weights in their binding keys.
func TestConsistentHashExchangeSpreadsByWeight(t *testing.T) {
	_, ch, exchange := declareConsistentHash(t, nil)
	weights := []int{1, 3}
	queues := make([]string, len(weights))
	for index, weight := range weights {
		queues[index] = declareQueue(t, ch, fmt.Sprint("chx-", weight)).Name
		if err := ch.QueueBind(queues[index], fmt.Sprint(weight), exchange, false, nil); err != nil {
			t.Fatalf("queue.bind weight %d: %v", weight, err)
		}
	}
	const keys = 2000
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2*keys))
	for round := 0; round < 2; round++ {
		for key := 0; key < keys; key++ {
			name := fmt.Sprint("key-", key)
			if err := ch.PublishWithContext(context.Background(), exchange, name, false, false, amqp.Publishing{Body: []byte(name)}); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	for index := 0; index < 2*keys; index++ {
		select {
		case confirm := <-confirms:
			if !confirm.Ack {
				t.Fatalf("publish %d nacked", confirm.DeliveryTag)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("%d of %d confirms within %s", index, 2*keys, waitTimeout)
		}
	}
	queueOf := map[string]string{}
	shares := make([]int, len(queues))
	for index, queue := range queues {
		for _, key := range drainBodies(t, ch, queue) {
			if previous, seen := queueOf[key]; seen && previous != queue {
				t.Fatalf("key %s reached two queues", key)
			} else if !seen {
				shares[index]++
			}
			queueOf[key] = queue
		}
	}
	if len(queueOf) != keys {
		t.Fatalf("%d distinct keys arrived, want %d", len(queueOf), keys)
	}
	for index, weight := range weights {
		expected := float64(keys*weight) / 4
		if diff := float64(shares[index]) - expected; diff > expected*0.15 || diff < -expected*0.15 {
			t.Fatalf("weight %d got %d keys, want %.0f within 15%% (shares %v)", weight, shares[index], expected, shares)
		}
	}
	t.Logf("shares for weights %v: %v", weights, shares)
}

// x-consistent-hash binding keys are positive integers: RabbitMQ's plugin's 406 texts.
func TestConsistentHashBadBindingKeyIs406(t *testing.T) {
	conn, _, exchange := declareConsistentHash(t, nil)
	for key, want := range map[string]string{
		"abc": `PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>`,
		"0":   "PRECONDITION_FAILED - The binding key must be greater than 0",
	} {
		ch := openChannel(t, conn)
		queue := declareQueue(t, ch, "chx-bad").Name
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		err := ch.QueueBind(queue, key, exchange, false, nil)
		e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
		if e.Reason != want {
			t.Fatalf("binding key %q: reply text %q, want %q", key, e.Reason, want)
		}
	}
}

// x-delayed-message (Lepus only): x-delay (any integer type) holds a message back, then it is
// routed by the x-delayed-type with x-delay negated, a signed int as the plugin writes it (int32);
// an undelayed one goes at once; no x-delayed-type is 406.
func TestDelayedMessageExchange(t *testing.T) {
	lepusOnly(t, "the RabbitMQ reference node lacks rabbitmq_delayed_message_exchange (not in Debian's package)")
	conn, ch := connChannel(t)
	exchange := declareExchange(t, ch, "delayed", "x-delayed-message", amqp.Table{"x-delayed-type": "direct"})
	queue := declareQueue(t, ch, "delayed-q").Name
	if err := ch.QueueBind(queue, "k", exchange, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	msgs := consume(t, ch, queue, true)
	published := time.Now()
	publish(t, ch, exchange, "k", amqp.Publishing{Body: []byte("late"), Headers: amqp.Table{"x-delay": int64(600)}})
	publish(t, ch, exchange, "k", amqp.Publishing{Body: []byte("early"), Headers: amqp.Table{"x-delay": int32(300)}})
	publish(t, ch, exchange, "k", amqp.Publishing{Body: []byte("now")})
	got := receiveN(t, msgs, 3)
	if want := []string{"now", "early", "late"}; !reflect.DeepEqual(bodies(got), want) {
		t.Fatalf("arrival order %v, want %v", bodies(got), want)
	}
	if elapsed := time.Since(published); elapsed < 600*time.Millisecond {
		t.Fatalf("the 600 ms message arrived after %s", elapsed)
	}
	if got[0].Headers != nil && len(got[0].Headers) != 0 {
		t.Errorf("the undelayed message has headers %#v", got[0].Headers)
	}
	for index, delay := range map[int]int32{1: -300, 2: -600} {
		if value, ok := got[index].Headers["x-delay"].(int32); !ok || value != delay {
			t.Errorf("%q: x-delay = %#v (%T), want int32 %d", got[index].Body, got[index].Headers["x-delay"], got[index].Headers["x-delay"], delay)
		}
	}
	bad := openChannel(t, conn)
	closed := bad.NotifyClose(make(chan *amqp.Error, 1))
	err := bad.ExchangeDeclare(uniqueName(t, "delayed-bad"), "x-delayed-message", false, false, false, false, nil)
	e := expectChannelError(t, conn, bad, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if e.Reason != "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type" {
		t.Fatalf("reply text %q", e.Reason)
	}
}

// Message deduplication (Lepus only, LavinMQ's argument and header names): a queue enqueues a
// key once; an exchange routes a key once and returns a mandatory duplicate 312 NO_ROUTE, still
// confirming it; x-deduplication-header names another header.
func TestMessageDeduplication(t *testing.T) {
	lepusOnly(t, "RabbitMQ 3.10.8 has no message deduplication (a plugin not in Debian's package)")
	_, ch := confirmChannel(t)
	queue := declareWithArgs(t, ch, "dedup-q", amqp.Table{"x-message-deduplication": true, "x-cache-size": int32(100)})
	for _, message := range [][2]string{{"q1", "x"}, {"q2", "x"}, {"q3", "y"}} {
		publish(t, ch, "", queue, amqp.Publishing{Body: []byte(message[0]), Headers: amqp.Table{"x-deduplication-header": message[1]}})
	}
	if got := []string{string(getOne(t, ch, queue, true).Body), string(getOne(t, ch, queue, true).Body)}; !reflect.DeepEqual(got, []string{"q1", "q3"}) {
		t.Fatalf("queue kept %v, want [q1 q3]", got)
	}
	expectQueueStaysEmpty(t, ch, queue)

	exchange := declareExchange(t, ch, "dedup-x", "direct", amqp.Table{"x-message-deduplication": true, "x-deduplication-header": "id"})
	target := declareQueue(t, ch, "dedup-target").Name
	if err := ch.QueueBind(target, "k", exchange, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 4))
	publishFlags(t, ch, exchange, "k", true, amqp.Publishing{Body: []byte("first"), Headers: amqp.Table{"id": "order-1"}})
	publishFlags(t, ch, exchange, "k", true, amqp.Publishing{Body: []byte("again"), Headers: amqp.Table{"id": "order-1"}})
	publishFlags(t, ch, exchange, "k", true, amqp.Publishing{Body: []byte("not-the-key"), Headers: amqp.Table{"x-deduplication-header": "order-1"}})
	select {
	case r := <-returns:
		if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" || string(r.Body) != "again" {
			t.Fatalf("returned %d %q %q, want 312 NO_ROUTE again", r.ReplyCode, r.ReplyText, r.Body)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("the mandatory duplicate was not returned")
	}
	if first, second := getOne(t, ch, target, true), getOne(t, ch, target, true); string(first.Body) != "first" || string(second.Body) != "not-the-key" {
		t.Fatalf("exchange routed %q, %q; want first, not-the-key", first.Body, second.Body)
	}
	expectQueueStaysEmpty(t, ch, target)
}

// x-delivery-limit with x-delivery-count: quorum semantics. RabbitMQ 3.10.8 has it on quorum
// queues only (a classic queue is refused with 406, checked); Lepus also on classic queues, as an
// extension, so the same behaviour is checked on a quorum queue on RabbitMQ and a classic one on
// Lepus, as the Python suite does.
func TestDeliveryLimitDeadLettersWithDeliveryCount(t *testing.T) {
	conn, ch := connChannel(t)
	dead := declareQueue(t, ch, "limit-dead").Name
	args := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead, "x-delivery-limit": int32(1)}
	source := uniqueName(t, "limited")
	durable := false
	if brokerProduct(t) != "Lepus" {
		expectDeclareRefused(t, conn, args,
			"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue '%s' in vhost '/' of queue type rabbit_classic_queue")
		args["x-queue-type"] = "quorum"
		durable = true
	}
	if _, err := ch.QueueDeclare(source, durable, false, false, false, args); err != nil {
		t.Fatalf("queue.declare %s: %v", source, err)
	}
	cleanupQueue(t, source)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	publish(t, ch, "", source, amqp.Publishing{Body: []byte("fragile"), Headers: amqp.Table{"keep": "me"}})
	var counts []interface{}
	for i := 0; i < 2; i++ {
		d := getEventually(t, ch, source)
		counts = append(counts, d.Headers["x-delivery-count"])
		if err := d.Nack(false, true); err != nil {
			t.Fatalf("basic.nack: %v", err)
		}
	}
	if want := []interface{}{int64(0), int64(1)}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("x-delivery-count %#v of types %T, %T; want int64 0, 1 (a long, as RabbitMQ writes it)", counts, counts[0], counts[1])
	}
	d := getEventually(t, ch, dead)
	if string(d.Body) != "fragile" || d.Headers["keep"] != "me" {
		t.Fatalf("dead letter %q headers %#v", d.Body, d.Headers)
	}
	if _, ok := d.Headers["x-delivery-count"]; ok {
		t.Errorf("the dead letter carries x-delivery-count %#v: it is the message as published", d.Headers["x-delivery-count"])
	}
	deaths, _ := d.Headers["x-death"].([]interface{})
	if len(deaths) != 1 {
		t.Fatalf("x-death = %#v", d.Headers["x-death"])
	}
	if entry, _ := deaths[0].(amqp.Table); entry["reason"] != "delivery_limit" || entry["queue"] != source {
		t.Fatalf("x-death[0] = %#v, want reason delivery_limit, queue %s", entry, source)
	}
	assertMessageCount(t, ch, source, 0)
}

// Dead-letter cycles are cut as RabbitMQ cuts them: a message expiring into a fanout that feeds
// its own queue and a witness reaches only the witness (the copy for its own queue is dropped, as
// x-death already names that queue with no reject on the way); a client's reject is no cycle: a
// message rejected into its own queue comes back, counted.
func TestDeadLetterCycleOfExpiriesIsCutAndRejectsAreNot(t *testing.T) {
	_, ch := confirmChannel(t)
	fanout := declareExchange(t, ch, "cycle-dlx", "fanout", nil)
	loop := declareWithArgs(t, ch, "cycle", amqp.Table{"x-message-ttl": int32(100), "x-dead-letter-exchange": fanout})
	witness := declareQueue(t, ch, "cycle-witness").Name
	for _, queue := range []string{loop, witness} {
		if err := ch.QueueBind(queue, "", fanout, false, nil); err != nil {
			t.Fatalf("queue.bind %s: %v", queue, err)
		}
	}
	publishText(t, ch, "", loop, "round")
	d := getEventually(t, ch, witness)
	if string(d.Body) != "round" {
		t.Fatalf("witness got %q", d.Body)
	}
	xDeath(t, d, loop, "expired")
	expectQueueStaysEmpty(t, ch, loop)
	expectQueueStaysEmpty(t, ch, witness)

	rejected := uniqueName(t, "cycle-rejected")
	if _, err := ch.QueueDeclare(rejected, false, false, false, false,
		amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": rejected}); err != nil {
		t.Fatalf("queue.declare %s: %v", rejected, err)
	}
	cleanupQueue(t, rejected)
	publishText(t, ch, "", rejected, "again")
	for round := 0; round < 2; round++ {
		if err := getEventually(t, ch, rejected).Reject(false); err != nil {
			t.Fatalf("basic.reject: %v", err)
		}
	}
	d = getEventually(t, ch, rejected)
	deaths, _ := d.Headers["x-death"].([]interface{})
	if len(deaths) != 1 {
		t.Fatalf("x-death = %#v, want one entry", d.Headers["x-death"])
	}
	if entry, _ := deaths[0].(amqp.Table); entry["count"] != int64(2) || entry["reason"] != "rejected" || entry["queue"] != rejected {
		t.Fatalf("x-death[0] = %#v, want count 2, reason rejected, queue %s", entry, rejected)
	}
}

// A priority queue's consumer gets what waited in priority order; a message without the priority
// property counts as 0; a non-integer x-max-priority is RabbitMQ's 406.
func TestPriorityQueueConsumerGetsHigherPrioritiesFirst(t *testing.T) {
	conn, ch := confirmChannel(t)
	queue := declareWithArgs(t, ch, "priority-consume", amqp.Table{"x-max-priority": int32(10)})
	publish(t, ch, "", queue, amqp.Publishing{Body: []byte("none")})
	for _, priority := range []uint8{3, 10, 1, 7} {
		publish(t, ch, "", queue, amqp.Publishing{Body: []byte(fmt.Sprint("p", priority)), Priority: priority})
	}
	publish(t, ch, "", queue, amqp.Publishing{Body: []byte("zero"), Priority: 0})
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	msgs := consume(t, ch, queue, false)
	var got []string
	for i := 0; i < 6; i++ {
		d := receive(t, msgs)
		got = append(got, string(d.Body))
		if err := d.Ack(false); err != nil {
			t.Fatalf("basic.ack: %v", err)
		}
	}
	if want := []string{"p10", "p7", "p3", "p1", "none", "zero"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("delivery order %v, want %v", got, want)
	}
	expectDeclareRefused(t, conn, amqp.Table{"x-max-priority": "5"},
		"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '%s' in vhost '/': \"expected integer, got longstr\"")
}

// The lower of the queue's x-message-ttl and a message's expiration applies, either way round.
func TestMessageTTLTheLowerOfQueueAndMessageApplies(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "lower-dead").Name
	for _, c := range []struct{ queueTTL, expiration string }{{"60000", "100"}, {"100", "60000"}} {
		var ttl int32
		_, _ = fmt.Sscan(c.queueTTL, &ttl)
		source := declareWithArgs(t, ch, "lower", amqp.Table{"x-message-ttl": ttl,
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
		publish(t, ch, "", source, amqp.Publishing{Body: []byte(c.queueTTL), Expiration: c.expiration})
		d := getEventually(t, ch, dead)
		entry := xDeath(t, d, source, "expired")
		if expiration, ok := entry["original-expiration"].(string); !ok || expiration != c.expiration {
			t.Errorf("queue TTL %s: x-death[0].original-expiration = %#v, want %q", c.queueTTL, entry["original-expiration"], c.expiration)
		}
	}
}

// A reply to a requesting channel that has gone, or to an address no channel made, is dropped;
// the replier's channel stays open. Two requesting channels get two addresses.
func TestDirectReplyToGoneOrMadeUpAddressIsDropped(t *testing.T) {
	clientConn, client := connChannel(t)
	if _, err := client.Consume(directReplyTo, "", true, false, false, false, nil); err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	_, server := connChannel(t)
	closed := server.NotifyClose(make(chan *amqp.Error, 1))
	requests := declareQueue(t, server, "rpc-gone").Name
	publish(t, client, "", requests, amqp.Publishing{Body: []byte("ping"), ReplyTo: directReplyTo})
	first := getEventually(t, server, requests)
	other := openChannel(t, dial(t))
	if _, err := other.Consume(directReplyTo, "", true, false, false, false, nil); err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	publish(t, other, "", requests, amqp.Publishing{Body: []byte("ping-2"), ReplyTo: directReplyTo})
	second := getEventually(t, server, requests)
	if first.ReplyTo == second.ReplyTo {
		t.Fatalf("two requesting channels share the address %q", first.ReplyTo)
	}
	_ = clientConn.Close()
	publish(t, server, "", first.ReplyTo, amqp.Publishing{Body: []byte("late")})
	publish(t, server, "", directReplyTo+".made-up", amqp.Publishing{Body: []byte("nobody")})
	if _, err := server.QueueDeclarePassive(requests, false, false, false, false, nil); err != nil {
		t.Fatalf("the replier's channel: %v", err)
	}
	select {
	case e := <-closed:
		t.Fatalf("the replier's channel was closed: %v", e)
	default:
	}
}

// x-consistent-hash with hash-header or hash-property (message_id): the routing key no longer
// decides, each value keeps its queue; the plugin's 406 texts for bad arguments.
func TestConsistentHashHeaderAndProperty(t *testing.T) {
	for _, c := range []struct {
		args    amqp.Table
		message func(value string) amqp.Publishing
	}{
		{amqp.Table{"hash-header": "shard"}, func(value string) amqp.Publishing {
			return amqp.Publishing{Body: []byte(value), Headers: amqp.Table{"shard": value}}
		}},
		{amqp.Table{"hash-property": "message_id"}, func(value string) amqp.Publishing {
			return amqp.Publishing{Body: []byte(value), MessageId: value}
		}},
	} {
		_, ch, exchange := declareConsistentHash(t, c.args)
		if err := ch.Confirm(false); err != nil {
			t.Fatalf("confirm.select: %v", err)
		}
		queues := make([]string, 3)
		for index := range queues {
			queues[index] = declareQueue(t, ch, "chx-by").Name
			if err := ch.QueueBind(queues[index], "1", exchange, false, nil); err != nil {
				t.Fatalf("queue.bind: %v", err)
			}
		}
		for round := 0; round < 3; round++ {
			for value := 0; value < 60; value++ {
				publish(t, ch, exchange, fmt.Sprint("rk-", round, "-", value), c.message(fmt.Sprint("v-", value)))
			}
		}
		queueOf := map[string]string{}
		reached := 0
		for _, queue := range queues {
			got := drainBodies(t, ch, queue)
			for _, value := range got {
				if previous, seen := queueOf[value]; seen && previous != queue {
					t.Fatalf("%v: value %s reached two queues", c.args, value)
				}
				queueOf[value] = queue
			}
			if len(got) > 0 {
				reached++
			}
		}
		if len(queueOf) != 60 || reached != 3 {
			t.Fatalf("%v: %d values arrived in %d queues, want 60 in 3", c.args, len(queueOf), reached)
		}
	}
	conn := dial(t)
	for _, c := range []struct {
		args amqp.Table
		want string
	}{
		{amqp.Table{"hash-property": "app_id"}, "PRECONDITION_FAILED - Unsupported property: app_id"},
		{amqp.Table{"hash-property": "message_id", "hash-header": "h"}, "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"},
	} {
		ch := openChannel(t, conn)
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		err := ch.ExchangeDeclare(uniqueName(t, "chx-bad"), "x-consistent-hash", false, false, false, false, c.args)
		if e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED"); e.Reason != c.want {
			t.Errorf("%v: reply text %q, want %q", c.args, e.Reason, c.want)
		}
	}
}

// x-single-active-consumer: when the active consumer cancels, the next in subscription order
// takes the following messages; a waiting one cancelling changes nothing; an exclusive consumer
// is refused 403 with RabbitMQ's text.
func TestSingleActiveConsumerCancelHandsOverInSubscriptionOrder(t *testing.T) {
	conn, publisher := confirmChannel(t)
	queue := declareWithArgs(t, publisher, "sac-cancel", amqp.Table{"x-single-active-consumer": true})
	channels := make([]*amqp.Channel, 3)
	deliveries := make([]<-chan amqp.Delivery, 3)
	for index := range channels {
		channels[index] = openChannel(t, conn)
		msgs, err := channels[index].Consume(queue, fmt.Sprint("c", index), true, false, false, false, nil)
		if err != nil {
			t.Fatalf("basic.consume c%d: %v", index, err)
		}
		deliveries[index] = msgs
	}
	publishText(t, publisher, "", queue, "a")
	if d := receive(t, deliveries[0]); string(d.Body) != "a" {
		t.Fatalf("c0 got %q", d.Body)
	}
	if err := channels[0].Cancel("c0", false); err != nil {
		t.Fatalf("basic.cancel c0: %v", err)
	}
	publishText(t, publisher, "", queue, "b")
	if d := receive(t, deliveries[1]); string(d.Body) != "b" {
		t.Fatalf("c1 got %q", d.Body)
	}
	if err := channels[2].Cancel("c2", false); err != nil {
		t.Fatalf("basic.cancel c2: %v", err)
	}
	publishText(t, publisher, "", queue, "c")
	if d := receive(t, deliveries[1]); string(d.Body) != "c" {
		t.Fatalf("c1 got %q", d.Body)
	}
	expectNoDelivery(t, deliveries[2])
	exclusive := openChannel(t, conn)
	closed := exclusive.NotifyClose(make(chan *amqp.Error, 1))
	_, err := exclusive.Consume(queue, "", true, true, false, false, nil)
	e := expectChannelError(t, conn, exclusive, closed, err, amqp.AccessRefused, "ACCESS_REFUSED")
	if want := fmt.Sprintf("ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", queue); e.Reason != want {
		t.Fatalf("reply text %q, want %q", e.Reason, want)
	}
}

// x-delayed-message (Lepus only): a delayed message routes nowhere at publish, as with the
// plugin: a mandatory one is returned 312 NO_ROUTE at once and the alternate exchange takes a
// copy (x-delay unchanged), and it is still delivered at its time.
func TestDelayedMessageMandatoryReturnAndAlternateExchange(t *testing.T) {
	lepusOnly(t, "the RabbitMQ reference node lacks rabbitmq_delayed_message_exchange (not in Debian's package)")
	_, ch := connChannel(t)
	alternate := declareExchange(t, ch, "delayed-ae", "fanout", nil)
	parked := declareQueue(t, ch, "delayed-parked").Name
	if err := ch.QueueBind(parked, "", alternate, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	exchange := declareExchange(t, ch, "delayed-m", "x-delayed-message", amqp.Table{"x-delayed-type": "direct", "alternate-exchange": alternate})
	plain := declareExchange(t, ch, "delayed-plain", "x-delayed-message", amqp.Table{"x-delayed-type": "direct"})
	queue := declareQueue(t, ch, "delayed-target").Name
	for _, source := range []string{exchange, plain} {
		if err := ch.QueueBind(queue, "k", source, false, nil); err != nil {
			t.Fatalf("queue.bind: %v", err)
		}
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 2))
	publishFlags(t, ch, plain, "k", true, amqp.Publishing{Body: []byte("returned"), Headers: amqp.Table{"x-delay": int32(200)}})
	publish(t, ch, exchange, "k", amqp.Publishing{Body: []byte("copied"), Headers: amqp.Table{"x-delay": int32(300)}})
	select {
	case r := <-returns:
		if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" || string(r.Body) != "returned" {
			t.Fatalf("returned %d %q %q, want 312 NO_ROUTE returned", r.ReplyCode, r.ReplyText, r.Body)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("the mandatory delayed message was not returned")
	}
	parkedCopy := getEventually(t, ch, parked)
	if string(parkedCopy.Body) != "copied" || parkedCopy.Headers["x-delay"] != int32(300) {
		t.Fatalf("alternate exchange copy %q with x-delay %#v, want copied with int32 300", parkedCopy.Body, parkedCopy.Headers["x-delay"])
	}
	msgs := consume(t, ch, queue, true)
	got := receiveN(t, msgs, 2)
	if want := []string{"returned", "copied"}; !reflect.DeepEqual(bodies(got), want) {
		t.Fatalf("delivered %v, want %v", bodies(got), want)
	}
	select {
	case r := <-returns:
		t.Fatalf("returned again at its due time: %q", r.Body)
	case <-time.After(quietPeriod):
	}
}

// Message deduplication (Lepus only): a key is routed again once its x-cache-ttl passes and a
// message's own x-cache-ttl header wins; a bad argument is 406 naming it, with the queue's name.
func TestMessageDeduplicationCacheTTLAndBadArguments(t *testing.T) {
	lepusOnly(t, "RabbitMQ 3.10.8 has no message deduplication (a plugin not in Debian's package)")
	conn, ch := confirmChannel(t)
	exchange := declareExchange(t, ch, "dedup-ttl", "direct", amqp.Table{"x-message-deduplication": true, "x-cache-ttl": int32(300)})
	queue := declareQueue(t, ch, "dedup-ttl-q").Name
	if err := ch.QueueBind(queue, "k", exchange, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	send := func(body, key string, ttl int32) {
		headers := amqp.Table{"x-deduplication-header": key}
		if ttl > 0 {
			headers["x-cache-ttl"] = ttl
		}
		publish(t, ch, exchange, "k", amqp.Publishing{Body: []byte(body), Headers: headers})
	}
	send("a1", "a", 0)
	send("b1", "b", 5000)
	send("a2", "a", 0)
	time.Sleep(450 * time.Millisecond)
	send("a3", "a", 0)
	send("b2", "b", 0)
	got := drainBodies(t, ch, queue)
	if want := []string{"a1", "b1", "a3"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("routed %v, want %v", got, want)
	}
	expectDeclareRefused(t, conn, amqp.Table{"x-message-deduplication": "yes"},
		"PRECONDITION_FAILED - invalid arg 'x-message-deduplication' for queue '%s' in vhost '/': {unacceptable_type,longstr}")
	expectDeclareRefused(t, conn, amqp.Table{"x-message-deduplication": true, "x-cache-ttl": int32(-5)},
		"PRECONDITION_FAILED - invalid arg 'x-cache-ttl' for queue '%s' in vhost '/': {value_negative,-5}")
}

// A dead letter for an exchange that does not exist is dropped silently, as RabbitMQ drops it;
// the channel stays open.
func TestDeadLetterToAMissingExchangeIsDropped(t *testing.T) {
	_, ch := confirmChannel(t)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	queue := declareWithArgs(t, ch, "dlx-missing", amqp.Table{"x-dead-letter-exchange": uniqueName(t, "missing")})
	publishText(t, ch, "", queue, "nowhere")
	if err := getOne(t, ch, queue, false).Reject(false); err != nil {
		t.Fatalf("basic.reject: %v", err)
	}
	expectQueueStaysEmpty(t, ch, queue)
	select {
	case e := <-closed:
		t.Fatalf("channel closed: %v", e)
	default:
	}
}

// x-message-ttl 0 with nobody consuming dead-letters at once (reason expired); x-max-length 0
// drops every message (drop-head dead-letters it, reason maxlen) or nacks it (reject-publish).
func TestZeroTTLAndZeroMaxLength(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "zero-dead").Name
	dlx := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
	withArgs := func(extra amqp.Table) amqp.Table {
		args := amqp.Table{}
		for key, value := range dlx {
			args[key] = value
		}
		for key, value := range extra {
			args[key] = value
		}
		return args
	}
	expiring := declareWithArgs(t, ch, "zero-ttl", withArgs(amqp.Table{"x-message-ttl": int32(0)}))
	publishText(t, ch, "", expiring, "expired")
	xDeath(t, getEventually(t, ch, dead), expiring, "expired")
	dropping := declareWithArgs(t, ch, "zero-len", withArgs(amqp.Table{"x-max-length": int32(0)}))
	publishText(t, ch, "", dropping, "dropped")
	xDeath(t, getEventually(t, ch, dead), dropping, "maxlen")
	assertMessageCount(t, ch, dropping, 0)
	rejecting := declareWithArgs(t, ch, "zero-reject", withArgs(amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", rejecting, false, false, amqp.Publishing{Body: []byte("refused")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if acked, err := dc.WaitContext(ctx); err != nil || acked {
		t.Fatalf("reject-publish at length 0: acked=%v err=%v, want a nack", acked, err)
	}
	expectQueueStaysEmpty(t, ch, dead)
}

// The direct reply-to pseudo-queue answers queue.declare (passive or not) with itself, no
// messages and one consumer; a second reply consumer on one channel is RabbitMQ's 406.
func TestDirectReplyToDeclareAndSecondConsumer(t *testing.T) {
	conn, ch := connChannel(t)
	for _, passive := range []bool{true, false} {
		declare := ch.QueueDeclare
		if passive {
			declare = ch.QueueDeclarePassive
		}
		q, err := declare(directReplyTo, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue.declare %s (passive %v): %v", directReplyTo, passive, err)
		}
		if q.Name != directReplyTo || q.Messages != 0 || q.Consumers != 1 {
			t.Fatalf("declare-ok (passive %v): %+v, want %s with 0 messages and 1 consumer", passive, q, directReplyTo)
		}
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := ch.Consume(directReplyTo, "first", true, false, false, false, nil); err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	_, err := ch.Consume(directReplyTo, "second", true, false, false, false, nil)
	e := expectChannelError(t, conn, ch, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
	if e.Reason != "PRECONDITION_FAILED - reply consumer already set" {
		t.Fatalf("reply text %q", e.Reason)
	}
}

// A requeued message keeps the expiry it had from its publish: nacked back after its TTL passed,
// it dead-letters as expired instead of being delivered again.
func TestMessageTTLCountsFromPublishAcrossARequeue(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "requeue-dead").Name
	queue := declareWithArgs(t, ch, "requeue-ttl", amqp.Table{"x-message-ttl": int32(300),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
	publishText(t, ch, "", queue, "old")
	d := getOne(t, ch, queue, false)
	time.Sleep(450 * time.Millisecond)
	if err := d.Nack(false, true); err != nil {
		t.Fatalf("basic.nack: %v", err)
	}
	if again, ok, err := ch.Get(queue, true); err != nil || ok {
		t.Fatalf("basic.get after the requeue: %q ok=%v err=%v, want get-empty (expired 300 ms after its publish)", again.Body, ok, err)
	}
	xDeath(t, getEventually(t, ch, dead), queue, "expired")
	expectQueueStaysEmpty(t, ch, queue)
}

// CC and BCC headers route a message to more queues; a dead letter's x-death routing-keys are
// its routing key and CC's (BCC is removed at publish, as RabbitMQ removes it). Lepus routed
// nothing by CC/BCC and kept BCC in the message until this test found it.
func TestDeadLetterRoutingKeysIncludeCC(t *testing.T) {
	_, ch := confirmChannel(t)
	fanout := declareExchange(t, ch, "cc-dlx", "fanout", nil)
	dead := declareQueue(t, ch, "cc-dead").Name
	if err := ch.QueueBind(dead, "", fanout, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	source := declareWithArgs(t, ch, "cc", amqp.Table{"x-dead-letter-exchange": fanout})
	carbon := declareQueue(t, ch, "cc-copy").Name
	blind := declareQueue(t, ch, "bcc-copy").Name
	publish(t, ch, "", source, amqp.Publishing{Body: []byte("copied"),
		Headers: amqp.Table{"CC": []interface{}{carbon}, "BCC": []interface{}{blind}}})
	for _, queue := range []string{carbon, blind} {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			t.Errorf("%s: no copy routed by the CC/BCC header", queue)
		} else if _, ok := d.Headers["BCC"]; ok {
			t.Errorf("%s: the BCC header reached a consumer: %#v", queue, d.Headers)
		}
	}
	original := getOne(t, ch, source, false)
	if _, ok := original.Headers["BCC"]; ok {
		t.Errorf("the BCC header reached the consumer of the routing key's queue: %#v", original.Headers)
	}
	if err := original.Reject(false); err != nil {
		t.Fatalf("basic.reject: %v", err)
	}
	d := getEventually(t, ch, dead)
	deaths, _ := d.Headers["x-death"].([]interface{})
	if len(deaths) != 1 {
		t.Fatalf("x-death = %#v", d.Headers["x-death"])
	}
	entry, _ := deaths[0].(amqp.Table)
	if keys := entry["routing-keys"]; !reflect.DeepEqual(keys, []interface{}{source, carbon}) {
		t.Fatalf("x-death[0].routing-keys = %#v, want [%s %s]", keys, source, carbon)
	}
	if cc, ok := d.Headers["CC"].([]interface{}); !ok || !reflect.DeepEqual(cc, []interface{}{carbon}) {
		t.Errorf("the dead letter's CC = %#v, want [%s]", d.Headers["CC"], carbon)
	}
}

// Redeclaring a queue with other feature arguments is RabbitMQ's 406 naming the argument, the
// value received and the current one (with their types); the queue is unchanged.
func TestFeatureArgumentsRedeclaredOtherwiseAre406(t *testing.T) {
	conn, ch := connChannel(t)
	args := amqp.Table{"x-max-priority": int32(10), "x-message-ttl": int32(60000), "x-max-length": int32(5),
		"x-overflow": "reject-publish", "x-dead-letter-exchange": "", "x-expires": int32(60000)}
	queue := declareWithArgs(t, ch, "redeclare", args)
	for _, c := range []struct {
		key   string
		value interface{}
		want  string
	}{
		{"x-max-priority", int32(5), "received '5' but current is '10'"},
		{"x-max-length", nil, "received none but current is the value '5' of type 'signedint'"},
		{"x-overflow", "drop-head", "received 'drop-head' but current is 'reject-publish'"},
		{"x-dead-letter-exchange", "other", "received 'other' but current is ''"},
		{"x-expires", int32(1000), "received '1000' but current is '60000'"},
	} {
		changed := amqp.Table{}
		for key, value := range args {
			changed[key] = value
		}
		if c.value == nil {
			delete(changed, c.key)
		} else {
			changed[c.key] = c.value
		}
		redeclare := openChannel(t, conn)
		closed := redeclare.NotifyClose(make(chan *amqp.Error, 1))
		_, err := redeclare.QueueDeclare(queue, false, false, false, false, changed)
		if err == nil {
			t.Errorf("redeclare with %s = %#v succeeded, want 406", c.key, c.value)
			continue
		}
		e := expectChannelError(t, conn, redeclare, closed, err, amqp.PreconditionFailed, "PRECONDITION_FAILED")
		want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg '%s' for queue '%s' in vhost '/': %s", c.key, queue, c.want)
		if e.Reason != want {
			t.Errorf("redeclare with %s = %#v:\n got %q\nwant %q", c.key, c.value, e.Reason, want)
		}
	}
	if _, err := openChannel(t, conn).QueueDeclare(queue, false, false, false, false, args); err != nil {
		t.Fatalf("the same arguments again: %v", err)
	}
}

// An integer argument redeclared with another integer type of the same value is equivalent, as
// RabbitMQ compares them (by type class). Lepus refused every one of them until this test found
// it ("inequivalent arg 'x-message-ttl' ...: received '60000' but current is '60000'").
func TestFeatureArgumentsOfAnotherIntegerTypeAreEquivalent(t *testing.T) {
	conn, ch := connChannel(t)
	args := amqp.Table{"x-max-priority": int32(10), "x-message-ttl": int32(60000), "x-max-length": int32(5),
		"x-max-length-bytes": int32(5000), "x-expires": int32(60000), "x-delivery-limit": int32(3)}
	if brokerProduct(t) != "Lepus" {
		delete(args, "x-delivery-limit") // quorum queues only on RabbitMQ
	}
	queue := declareWithArgs(t, ch, "redeclare-width", args)
	for key, value := range args {
		others := []interface{}{int64(value.(int32))}
		if value.(int32) <= 32767 {
			others = append(others, int16(value.(int32)))
		}
		for _, other := range others {
			changed := amqp.Table{}
			for k, v := range args {
				changed[k] = v
			}
			changed[key] = other
			if _, err := openChannel(t, conn).QueueDeclare(queue, false, false, false, false, changed); err != nil {
				t.Errorf("redeclare with %s = %T %v: %v", key, other, other, err)
			}
		}
	}
}

// x-max-length and x-max-length-bytes count ready messages only: messages delivered and not yet
// acknowledged leave room, and drop-head drops the oldest ready one, never an unacked one; when
// unacked messages are requeued past the limit, the oldest ready ones are dropped at once.
// (Lepus kept all four after the requeue, past x-max-length 2, until this test found it.)
func TestMaxLengthCountsReadyMessagesOnly(t *testing.T) {
	_, ch := confirmChannel(t)
	for _, args := range []amqp.Table{{"x-max-length": int32(2)}, {"x-max-length-bytes": int32(2)}} {
		queue := declareWithArgs(t, ch, "maxlen-ready", args)
		publishText(t, ch, "", queue, "u")
		publishText(t, ch, "", queue, "v")
		unacked := []amqp.Delivery{getOne(t, ch, queue, false), getOne(t, ch, queue, false)}
		for _, body := range []string{"w", "x", "y"} {
			publishText(t, ch, "", queue, body)
		}
		assertMessageCount(t, ch, queue, 2)
		for _, d := range unacked {
			if err := d.Nack(false, true); err != nil {
				t.Fatalf("basic.nack: %v", err)
			}
		}
		// basic.get after the nacks on one channel: the queue has taken the requeue by then.
		got := drainBodies(t, ch, queue)
		if want := []string{"x", "y"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%v: kept %v after the requeue, want %v (the requeued u, v are dropped from the head)", args, got, want)
		}
	}
}

// A mandatory reply that reaches no requesting channel is returned 312 NO_ROUTE, as RabbitMQ
// returns it: to an address whose channel has gone, to an address no channel made, and to the
// bare pseudo-queue name. Lepus returned only the last and dropped the other two
// silently until this test found it.
func TestDirectReplyToMandatoryReplyToNobodyIsReturned(t *testing.T) {
	clientConn, client := connChannel(t)
	if _, err := client.Consume(directReplyTo, "", true, false, false, false, nil); err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	_, server := confirmChannel(t)
	requests := declareQueue(t, server, "rpc-mandatory").Name
	publish(t, client, "", requests, amqp.Publishing{Body: []byte("ping"), ReplyTo: directReplyTo})
	gone := getEventually(t, server, requests).ReplyTo
	_ = clientConn.Close()
	returns := server.NotifyReturn(make(chan amqp.Return, 3))
	addresses := []string{gone, directReplyTo + ".made-up", directReplyTo}
	for _, address := range addresses {
		publishFlags(t, server, "", address, true, amqp.Publishing{Body: []byte(address)})
	}
	returned := map[string]bool{}
	for range addresses {
		select {
		case r := <-returns:
			if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" || r.RoutingKey != string(r.Body) {
				t.Errorf("returned %d %q, key %q for %q", r.ReplyCode, r.ReplyText, r.RoutingKey, r.Body)
			}
			returned[string(r.Body)] = true
		case <-time.After(quietPeriod):
		}
	}
	for _, address := range addresses {
		if !returned[address] {
			t.Errorf("the mandatory reply to %q was not returned", address)
		}
	}
}

// x-delivery-count counts every return: a channel closed with the message unacked and a reject
// with requeue alike (quorum queue on RabbitMQ, classic on Lepus).
func TestDeliveryCountCountsChannelCloseAndReject(t *testing.T) {
	conn, ch := connChannel(t)
	args := amqp.Table{"x-delivery-limit": int32(10)}
	durable := false
	if brokerProduct(t) != "Lepus" {
		args["x-queue-type"] = "quorum"
		durable = true
	}
	source := uniqueName(t, "delivery-count")
	if _, err := ch.QueueDeclare(source, durable, false, false, false, args); err != nil {
		t.Fatalf("queue.declare %s: %v", source, err)
	}
	cleanupQueue(t, source)
	publishText(t, ch, "", source, "m")
	var seen []string
	for round := 0; round < 2; round++ {
		other := openChannel(t, conn)
		d := getEventually(t, other, source)
		seen = append(seen, fmt.Sprintf("%v/%v", d.Headers["x-delivery-count"], d.Redelivered))
		_ = other.Close()
	}
	d := getEventually(t, ch, source)
	seen = append(seen, fmt.Sprintf("%v/%v", d.Headers["x-delivery-count"], d.Redelivered))
	if err := d.Reject(true); err != nil {
		t.Fatalf("basic.reject: %v", err)
	}
	d = getEventually(t, ch, source)
	seen = append(seen, fmt.Sprintf("%v/%v", d.Headers["x-delivery-count"], d.Redelivered))
	if want := []string{"0/false", "1/true", "2/true", "3/true"}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("x-delivery-count/redelivered %v, want %v", seen, want)
	}
}

// A publish routed to several queues is nacked when one of them refuses it (reject-publish), and
// the others keep their copy, as RabbitMQ does.
func TestRejectPublishByOneQueueNacksAndTheOthersKeepIt(t *testing.T) {
	_, ch := confirmChannel(t)
	full := declareWithArgs(t, ch, "refusing", amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	open := declareQueue(t, ch, "taking").Name
	fanout := declareExchange(t, ch, "reject-fan", "fanout", nil)
	for _, queue := range []string{full, open} {
		if err := ch.QueueBind(queue, "", fanout, false, nil); err != nil {
			t.Fatalf("queue.bind: %v", err)
		}
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), fanout, "", false, false, amqp.Publishing{Body: []byte("two")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if acked, err := dc.WaitContext(ctx); err != nil || acked {
		t.Fatalf("acked=%v err=%v, want a nack", acked, err)
	}
	if got := drainBodies(t, ch, open); !reflect.DeepEqual(got, []string{"two"}) {
		t.Fatalf("the accepting queue holds %v, want [two]", got)
	}
	assertMessageCount(t, ch, full, 0)
}

// A dead letter keeps the message's properties (priority, correlation id, delivery mode, message
// id, timestamp, type, app id, content type), is not marked redelivered, and carries the
// dead-letter routing key on the dead-letter exchange.
func TestDeadLetterKeepsTheProperties(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "props-dead").Name
	source := declareWithArgs(t, ch, "props", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead, "x-max-priority": int32(5)})
	sent := amqp.Publishing{Body: []byte("props"), Priority: 3, CorrelationId: "c", DeliveryMode: amqp.Persistent, MessageId: "m",
		Timestamp: time.Unix(1700000000, 0), Type: "ty", AppId: "app", ContentType: "text/x", ReplyTo: "back"}
	publish(t, ch, "", source, sent)
	if err := getOne(t, ch, source, false).Reject(false); err != nil {
		t.Fatalf("basic.reject: %v", err)
	}
	d := getEventually(t, ch, dead)
	got := amqp.Publishing{Body: d.Body, Priority: d.Priority, CorrelationId: d.CorrelationId, DeliveryMode: d.DeliveryMode, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, ContentType: d.ContentType, ReplyTo: d.ReplyTo}
	if got.Timestamp.Unix() != sent.Timestamp.Unix() {
		t.Errorf("timestamp %v, want %v", got.Timestamp, sent.Timestamp)
	}
	got.Timestamp = sent.Timestamp
	if !reflect.DeepEqual(got, sent) {
		t.Errorf("dead letter\n got %+v\nwant %+v", got, sent)
	}
	if d.Redelivered || d.Exchange != "" || d.RoutingKey != dead {
		t.Errorf("redelivered %v, exchange %q, routing key %q; want false, \"\", %q", d.Redelivered, d.Exchange, d.RoutingKey, dead)
	}
}

// A mandatory reply to a live direct reply-to address is delivered. RabbitMQ 3.10.8 also returns
// it (312 NO_ROUTE: its direct replies bypass queue routing, so the mandatory check sees no
// queue), which Lepus does not copy: it returns only a reply that reached no one. The return is
// logged here, not required either way.
func TestDirectReplyToMandatoryReplyIsDelivered(t *testing.T) {
	_, client := connChannel(t)
	replies, err := client.Consume(directReplyTo, "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	_, server := confirmChannel(t)
	requests := declareQueue(t, server, "rpc-live").Name
	publish(t, client, "", requests, amqp.Publishing{Body: []byte("ping"), ReplyTo: directReplyTo})
	request := getEventually(t, server, requests)
	returns := server.NotifyReturn(make(chan amqp.Return, 1))
	publishFlags(t, server, "", request.ReplyTo, true, amqp.Publishing{Body: []byte("pong")})
	if reply := receive(t, replies); string(reply.Body) != "pong" {
		t.Fatalf("reply %q", reply.Body)
	}
	select {
	case r := <-returns:
		t.Logf("%s returned the delivered reply too: %d %q", brokerProduct(t), r.ReplyCode, r.ReplyText)
	case <-time.After(quietPeriod):
		t.Logf("%s did not return the delivered reply", brokerProduct(t))
	}
}

// An expiration of "0" behind a consumer at its prefetch limit expires: it is never delivered,
// the next message is.
func TestExpirationZeroBehindABusyConsumerIsDropped(t *testing.T) {
	_, ch := confirmChannel(t)
	queue := declareQueue(t, ch, "zero-busy").Name
	consumer := openChannel(t, dial(t))
	if err := consumer.Qos(1, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	msgs := consume(t, consumer, queue, false)
	publishText(t, ch, "", queue, "first")
	publish(t, ch, "", queue, amqp.Publishing{Body: []byte("now-or-never"), Expiration: "0"})
	publishText(t, ch, "", queue, "third")
	first := receive(t, msgs)
	time.Sleep(100 * time.Millisecond)
	if err := first.Ack(false); err != nil {
		t.Fatalf("basic.ack: %v", err)
	}
	next := receive(t, msgs)
	_ = next.Ack(false)
	if got := []string{string(first.Body), string(next.Body)}; !reflect.DeepEqual(got, []string{"first", "third"}) {
		t.Fatalf("delivered %v, want [first third]", got)
	}
	expectNoDelivery(t, msgs)
}

// A mandatory publish refused by a full reject-publish queue is nacked, not returned: it was
// routed.
func TestRejectPublishMandatoryIsNackedNotReturned(t *testing.T) {
	_, ch := confirmChannel(t)
	full := declareWithArgs(t, ch, "full-mandatory", amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", full, true, false, amqp.Publishing{Body: []byte("m")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if acked, err := dc.WaitContext(ctx); err != nil || acked {
		t.Fatalf("acked=%v err=%v, want a nack", acked, err)
	}
	select {
	case r := <-returns:
		t.Fatalf("returned %d %q", r.ReplyCode, r.ReplyText)
	case <-time.After(quietPeriod):
	}
}

// A message dead-lettered for its queue's length (drop-head drops the old one, reject-publish-dlx
// the new one) loses its expiration to x-death's original-expiration, and its first death's
// x-first-death-* replace any the publisher wrote.
func TestMaxLengthDeadLetterKeepsOriginalExpiration(t *testing.T) {
	_, ch := confirmChannel(t)
	dead := declareQueue(t, ch, "maxlen-exp-dead").Name
	for overflow, want := range map[string]string{"drop-head": "m1", "reject-publish-dlx": "m2"} {
		queue := declareWithArgs(t, ch, overflow, amqp.Table{"x-max-length": int32(1), "x-overflow": overflow,
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
		forged := amqp.Table{"x-first-death-queue": "forged", "x-first-death-reason": "forged"}
		for _, body := range []string{"m1", "m2"} {
			if err := ch.PublishWithContext(context.Background(), "", queue, false, false,
				amqp.Publishing{Body: []byte(body), Expiration: "60000", Headers: forged}); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		d := getEventually(t, ch, dead)
		if string(d.Body) != want || d.Expiration != "" {
			t.Fatalf("%s: dead letter %q with expiration %q, want %s without one", overflow, d.Body, d.Expiration, want)
		}
		if entry := xDeath(t, d, queue, "maxlen"); entry["original-expiration"] != "60000" {
			t.Errorf("%s: original-expiration %#v, want \"60000\"", overflow, entry["original-expiration"])
		}
	}
}

// A redeclare compares only the arguments RabbitMQ knows: an argument it does not know may
// change, come or go, and x-queue-type classic may be named or left out. Lepus refused an
// unknown argument changed, added or left out until this test found it.
func TestRedeclareComparesOnlyKnownArguments(t *testing.T) {
	conn, ch := connChannel(t)
	for _, c := range []struct{ first, second amqp.Table }{
		{amqp.Table{"x-custom": "a"}, amqp.Table{"x-custom": "b"}},
		{amqp.Table{"x-custom": "a"}, nil},
		{nil, amqp.Table{"x-custom": int32(1)}},
		{amqp.Table{"x-queue-type": "classic"}, nil},
		{nil, amqp.Table{"x-queue-type": "classic"}},
	} {
		queue := declareWithArgs(t, ch, "known-args", c.first)
		if _, err := openChannel(t, conn).QueueDeclare(queue, false, false, false, false, c.second); err != nil {
			t.Errorf("declared with %v, redeclared with %v: %v", c.first, c.second, err)
		}
	}
}
