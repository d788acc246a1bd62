package interop

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestDeadLetterXDeathHeaderTypes rejects a message into a dead-letter queue
// twice around a loop of two queues and checks the x-death header with the
// exact field types RabbitMQ 3.10.8 writes, which amqp091-go keeps apart:
// count a long (int64), time a timestamp (time.Time), the texts long strings,
// routing-keys an array of long strings; the repeated (queue, reason) entry
// counted again and moved to the front; x-first-death-* unchanged.
func TestDeadLetterXDeathHeaderTypes(t *testing.T) {
	_, ch := connChannel(t)
	first := uniqueName(t, "a")
	second := uniqueName(t, "b")
	for _, pair := range [][2]string{{first, second}, {second, first}} {
		args := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": pair[1]}
		if _, err := ch.QueueDeclare(pair[0], false, false, false, false, args); err != nil {
			t.Fatalf("queue.declare %s: %v", pair[0], err)
		}
		cleanupQueue(t, pair[0])
	}
	publish(t, ch, "", first, amqp.Publishing{Body: []byte("ping-pong"), Expiration: "60000"})
	for _, queue := range []string{first, second, first} {
		d := getEventually(t, ch, queue)
		if err := d.Reject(false); err != nil {
			t.Fatalf("basic.reject: %v", err)
		}
	}
	d := getEventually(t, ch, second)
	if err := d.Ack(false); err != nil {
		t.Fatalf("basic.ack: %v", err)
	}
	if d.Expiration != "" {
		t.Errorf("expiration %q kept, want it removed", d.Expiration)
	}
	deaths, ok := d.Headers["x-death"].([]interface{})
	if !ok || len(deaths) != 2 {
		t.Fatalf("x-death = %#v (%T), want an array of 2 tables", d.Headers["x-death"], d.Headers["x-death"])
	}
	want := []struct {
		queue string
		count int64
	}{{first, 2}, {second, 1}}
	for index, death := range deaths {
		entry, ok := death.(amqp.Table)
		if !ok {
			t.Fatalf("x-death[%d] is %T, want a table", index, death)
		}
		if count, ok := entry["count"].(int64); !ok || count != want[index].count {
			t.Errorf("x-death[%d].count = %#v (%T), want int64 %d", index, entry["count"], entry["count"], want[index].count)
		}
		for key, value := range map[string]string{"queue": want[index].queue, "reason": "rejected", "exchange": ""} {
			if text, ok := entry[key].(string); !ok || text != value {
				t.Errorf("x-death[%d].%s = %#v (%T), want string %q", index, key, entry[key], entry[key], value)
			}
		}
		if when, ok := entry["time"].(time.Time); !ok || time.Since(when) > time.Minute || time.Until(when) > time.Minute {
			t.Errorf("x-death[%d].time = %#v (%T), want a recent timestamp", index, entry["time"], entry["time"])
		}
		keys, ok := entry["routing-keys"].([]interface{})
		if !ok || len(keys) != 1 {
			t.Fatalf("x-death[%d].routing-keys = %#v (%T), want an array of one", index, entry["routing-keys"], entry["routing-keys"])
		}
		if key, ok := keys[0].(string); !ok || key != want[index].queue {
			t.Errorf("x-death[%d].routing-keys[0] = %#v (%T), want string %q", index, keys[0], keys[0], want[index].queue)
		}
	}
	// The entry of the first queue is the one counted again: it keeps what its first death wrote.
	again, _ := deaths[0].(amqp.Table)
	if expiration, ok := again["original-expiration"].(string); !ok || expiration != "60000" {
		t.Errorf("x-death[0].original-expiration = %#v, want string \"60000\"", again["original-expiration"])
	}
	for key, value := range map[string]string{"x-first-death-queue": first, "x-first-death-reason": "rejected", "x-first-death-exchange": ""} {
		if text, ok := d.Headers[key].(string); !ok || text != value {
			t.Errorf("%s = %#v (%T), want string %q", key, d.Headers[key], d.Headers[key], value)
		}
	}
}

// getEventually polls basic.get until the dead-lettered message arrives.
func getEventually(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if ok {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no message arrived in %s within %v", queue, waitTimeout)
	return amqp.Delivery{}
}
