package streaminterop

import (
	"fmt"
	"os"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// amqpURL is the same broker's AMQP 0-9-1 address, from AMQP_URL.
func amqpURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("AMQP_URL")
	if url == "" {
		t.Skip("needs AMQP_URL: the AMQP 0-9-1 address of the broker at STREAM_URL")
	}
	return url
}

func amqpChannel(t *testing.T) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL(t))
	if err != nil {
		t.Fatalf("AMQP dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	channel, err := conn.Channel()
	if err != nil {
		t.Fatalf("AMQP channel: %v", err)
	}
	return channel
}

// A stream created and written over the stream protocol is a stream queue AMQP 0-9-1 consumes.
func TestAStreamOfTheStreamProtocolIsAStreamQueueOverAmqp(t *testing.T) {
	channel := amqpChannel(t)
	env := environment(t, streamURL())
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	publishConfirmed(t, producer, producer.NotifyPublishConfirmation(), "s-0", "s-1", "s-2")
	// A passive declare finds it. (Its message count differs: RabbitMQ 3.10.8 answers 0 right
	// after the confirms, from statistics it gathers later; Lepus counts the offsets held.)
	if _, err := channel.QueueDeclarePassive(name, true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare over AMQP: %v", err)
	}
	if err := channel.Qos(10, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	deliveries, err := channel.Consume(name, "", false, false, false, false, amqp091.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatalf("consume over AMQP: %v", err)
	}
	for index := 0; index < 3; index++ {
		select {
		case delivery := <-deliveries:
			if string(delivery.Body) != fmt.Sprintf("s-%d", index) || delivery.Headers["x-stream-offset"] != int64(index) {
				t.Fatalf("AMQP delivery %d: %q at %v", index, delivery.Body, delivery.Headers["x-stream-offset"])
			}
			_ = delivery.Ack(false)
		case <-time.After(waitTimeout):
			t.Fatalf("AMQP delivery %d did not come", index)
		}
	}
}

// A stream queue declared and written over AMQP 0-9-1 is a stream the stream protocol reads.
func TestAStreamQueueOfAmqpIsAStreamOfTheStreamProtocol(t *testing.T) {
	channel := amqpChannel(t)
	env := environment(t, streamURL())
	name := streamName(t, env)
	if _, err := channel.QueueDeclare(name, true, false, false, false, amqp091.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatalf("declare over AMQP: %v", err)
	}
	if err := channel.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := channel.NotifyPublish(make(chan amqp091.Confirmation, 3))
	for index := 0; index < 3; index++ {
		if err := channel.Publish("", name, false, false, amqp091.Publishing{Body: []byte(fmt.Sprintf("a-%d", index))}); err != nil {
			t.Fatalf("publish over AMQP: %v", err)
		}
	}
	for index := 0; index < 3; index++ {
		select {
		case confirm := <-confirms:
			if !confirm.Ack {
				t.Fatalf("AMQP publish %d nacked", confirm.DeliveryTag)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("AMQP confirm %d did not come", index)
		}
	}
	got, offsets := consume(t, env, name, stream.OffsetSpecification{}.First()).wait(t, 3)
	equal(t, "bodies", got, []string{"a-0", "a-1", "a-2"})
	equal(t, "offsets", offsets, offsetsFrom(0, 3))
	// And a stream-protocol publisher can write to it.
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer on the AMQP-declared stream: %v", err)
	}
	defer producer.Close()
	confirmsStream := producer.NotifyPublishConfirmation()
	if err := producer.Send(amqp.NewMessage([]byte("s-3"))); err != nil {
		t.Fatalf("send: %v", err)
	}
	waitConfirmed(t, confirmsStream, 1)
}
